// Package imagebuild builds the container images the test node runs —
// cachetier's own, the pause (sandbox) image, CoreDNS and the monitoring
// stack (Prometheus Operator, its reloader, Prometheus) — without a
// container engine or a registry: binaries from the Go toolchain, images
// from hack/ociimage, each written as an OCI archive that
// `ctr -n k8s.io images import` loads.
//
// The cachetier image is what the Dockerfile builds, for machines that have
// no Docker: the binaries come from the Dockerfile's build stage command
// with its environment (buildEnv), and the runtime stage's declarations —
// binaries, user, entrypoint, labels — are restated in cachetierSpec. The
// package's tests keep both in agreement with the Dockerfile.
//
// Every image is reproducible, and its tag is derived from its manifest
// digest, so a node never keeps running a stale image under a reused tag.
package imagebuild

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/ociimage"
)

// The images Build knows, by name.
const (
	Cachetier = "cachetier"
	Pause     = "pause"
	CoreDNS   = "coredns"
	// NetCheck is hack/netcheck, the probe pod of hack/cluster's own test.
	NetCheck = "netcheck"
	// The monitoring stack of e2e/observability (monitoring.go).
	PromOperator   = "prometheus-operator"
	ConfigReloader = "prometheus-config-reloader"
	Prometheus     = "prometheus"
)

// Names lists every image, in build order.
func Names() []string {
	return []string{Cachetier, Pause, CoreDNS, NetCheck, PromOperator, ConfigReloader, Prometheus}
}

// Repositories of the images; the tag is added from the content. cachetier's
// is the one the manifests and the bundle name. The others never leave the
// node: "localhost/" is where containerd's and podman's users keep local
// images, and no pull would ever reach a registry for them.
const (
	cachetierRepo = "ghcr.io/cachetier/cachetier"
	pauseRepo     = "localhost/cachetier/pause"
	corednsRepo   = "localhost/cachetier/coredns"
	netcheckRepo  = "localhost/cachetier/netcheck"
)

// Image is one built image, as Build returns it and images.json lists it.
type Image struct {
	Name string `json:"name"`
	// Ref is the fully qualified name containerd knows the image by after
	// import; pods and the kubelet's sandbox image use it as is.
	Ref string `json:"ref"`
	// Digest is the manifest digest (sha256:...).
	Digest string `json:"digest"`
	// Tar is the absolute path of the OCI archive.
	Tar string `json:"tar"`
	// Size is the archive's size in bytes.
	Size int64 `json:"size"`
	// Written is false when an archive with this digest and ref was
	// already there and was left untouched.
	Written bool `json:"-"`
}

// ManifestFile is the name of the JSON list of Images in the output
// directory.
const ManifestFile = "images.json"

// Options for Build.
type Options struct {
	// Root is the repository root; default: found above the working
	// directory.
	Root string
	// Out is the output directory; default <Root>/bin/images. Binaries go
	// to Out/build/<image>/, archives to Out/<image>.tar.
	Out string
	// Images to build; default Names().
	Images []string
	// Log receives one progress line per step; default: discarded.
	Log io.Writer
}

// Build builds the images and writes their archives and Out/images.json
// (listing the images of this call). An archive whose image is unchanged
// is not rewritten, so a repeated Build costs the Go builds (which relink:
// the empty build id that makes binaries reproducible also defeats the go
// command's up-to-date check) and one gzip pass per image.
func Build(ctx context.Context, opts Options) ([]Image, error) {
	if opts.Root == "" {
		root, err := controlplane.RepoRoot()
		if err != nil {
			return nil, err
		}
		opts.Root = root
	}
	if opts.Out == "" {
		opts.Out = filepath.Join(opts.Root, "bin", "images")
	}
	out, err := filepath.Abs(opts.Out)
	if err != nil {
		return nil, err
	}
	opts.Out = out
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	names := opts.Images
	if len(names) == 0 {
		names = Names()
	}
	for _, name := range names {
		if !slices.Contains(Names(), name) {
			return nil, fmt.Errorf("unknown image %q (known: %s)", name, strings.Join(Names(), ", "))
		}
	}
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return nil, err
	}
	unlock, err := lockDir(ctx, opts.Out, opts.Log)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var images []Image
	for _, name := range names {
		start := time.Now()
		img, err := buildOne(ctx, opts, name)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", name, err)
		}
		state := "unchanged"
		if img.Written {
			state = "written"
		}
		fmt.Fprintf(opts.Log, "image %s: %s %s %s (%s, %d MB) in %s\n", name, img.Ref, img.Digest, img.Tar, state, img.Size>>20, time.Since(start).Round(100*time.Millisecond))
		images = append(images, img)
	}
	data, err := json.MarshalIndent(images, "", "  ")
	if err != nil {
		return nil, err
	}
	manifest := filepath.Join(opts.Out, ManifestFile)
	if err := os.WriteFile(manifest+".tmp", append(data, '\n'), 0o644); err != nil {
		return nil, err
	}
	if err := os.Rename(manifest+".tmp", manifest); err != nil {
		return nil, err
	}
	return images, nil
}

// lockDir takes an exclusive lock on out for the whole Build: test packages
// run in parallel and may build into the same directory, and one Build's
// linker must not rewrite a binary another Build is packing.
func lockDir(ctx context.Context, out string, log io.Writer) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(out, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for waited := false; ; waited = true {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", out, err)
		}
		if !waited {
			fmt.Fprintf(log, "waiting for another image build in %s\n", out)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ReadManifest reads the images.json that Build wrote into out.
func ReadManifest(out string) ([]Image, error) {
	data, err := os.ReadFile(filepath.Join(out, ManifestFile))
	if err != nil {
		return nil, err
	}
	var images []Image
	if err := json.Unmarshal(data, &images); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(out, ManifestFile), err)
	}
	return images, nil
}

// buildOne builds one image's binaries, then the image, then its archive
// unless an identical one is there.
func buildOne(ctx context.Context, opts Options, name string) (Image, error) {
	binDir := filepath.Join(opts.Out, "build", name)
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return Image{}, err
	}
	var spec ociimage.Spec
	var repo, tagPrefix string
	switch name {
	case Cachetier:
		if err := run(ctx, opts.Root, buildEnv(), "make", "build", "BIN="+binDir); err != nil {
			return Image{}, err
		}
		spec, repo, tagPrefix = cachetierSpec(binDir), cachetierRepo, "dev"
	case Pause:
		if err := goBuild(ctx, opts.Root, filepath.Join(binDir, "pause"), "./hack/pause", goFlags{}); err != nil {
			return Image{}, err
		}
		spec, repo, tagPrefix = pauseSpec(binDir), pauseRepo, "dev"
	case NetCheck:
		if err := goBuild(ctx, opts.Root, filepath.Join(binDir, "netcheck"), "./hack/netcheck", goFlags{}); err != nil {
			return Image{}, err
		}
		spec, repo, tagPrefix = binarySpec(binDir, "netcheck", nonrootUID, map[string]string{
			"org.opencontainers.image.source":      "https://github.com/cachetier/cachetier",
			"org.opencontainers.image.description": "cachetier test node network probe (hack/netcheck)",
		}), netcheckRepo, "dev"
	case CoreDNS:
		module := filepath.Join(opts.Root, "hack", "coredns-build")
		version, err := moduleVersion(ctx, module, corednsModule)
		if err != nil {
			return Image{}, err
		}
		if err := goBuild(ctx, module, filepath.Join(binDir, "coredns"), ".", goFlags{}); err != nil {
			return Image{}, err
		}
		spec, repo, tagPrefix = corednsSpec(binDir, version), corednsRepo, version
	case PromOperator:
		version, err := buildPromOperator(ctx, opts.Root, binDir, "operator")
		if err != nil {
			return Image{}, err
		}
		spec, repo, tagPrefix = promOperatorSpec(binDir, version), promOperatorRepo, version
	case ConfigReloader:
		version, err := buildPromOperator(ctx, opts.Root, binDir, "prometheus-config-reloader")
		if err != nil {
			return Image{}, err
		}
		spec, repo, tagPrefix = configReloaderSpec(binDir, version), configReloaderRepo, version
	case Prometheus:
		release, err := buildPrometheus(ctx, opts.Root, binDir)
		if err != nil {
			return Image{}, err
		}
		spec, repo, tagPrefix = prometheusSpec(binDir, release), prometheusRepo, "v"+release
	default:
		return Image{}, fmt.Errorf("unknown image %q", name)
	}
	for _, f := range spec.Files {
		if f.Source != "" {
			if err := checkStatic(f.Source); err != nil {
				return Image{}, err
			}
		}
	}
	img, err := ociimage.Build(spec)
	if err != nil {
		return Image{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return Image{}, err
	}
	result := Image{
		Name:   name,
		Ref:    repo + ":" + tagPrefix + "-" + digest.Hex[:12],
		Digest: digest.String(),
		Tar:    filepath.Join(opts.Out, name+".tar"),
	}
	if !archiveHolds(result.Tar, digest, result.Ref) {
		if err := ociimage.WriteArchiveFile(result.Tar, img, result.Ref); err != nil {
			return Image{}, err
		}
		result.Written = true
	}
	st, err := os.Stat(result.Tar)
	if err != nil {
		return Image{}, err
	}
	result.Size = st.Size()
	return result, nil
}

// archiveHolds reports whether path is an archive of exactly this image
// under this ref. Archives are replaced by rename, never written in place,
// so a matching index.json stands for the whole file.
func archiveHolds(path string, digest v1.Hash, ref string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	idx, err := ociimage.ReadArchiveIndex(f)
	if err != nil || len(idx.Manifests) != 1 {
		return false
	}
	m := idx.Manifests[0]
	return m.Digest == digest && m.Annotations[ociimage.AnnotationImageName] == ref
}

// buildEnv is the environment of the Dockerfile's build stage (its ENV line,
// with the default TARGETOS/TARGETARCH). TestDockerfileBuildStage keeps the
// two equal.
func buildEnv() []string {
	return []string{"GOOS=linux", "GOARCH=amd64", "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false -ldflags=-buildid="}
}

// goFlags are what a binary's build adds to goBuild's: build tags and
// linker flags (version stamping).
type goFlags struct{ tags, ldflags string }

// goBuild builds one static, reproducible binary the way the build stage
// builds cachetier's, stripped: the binaries of the other images have no
// Dockerfile to agree with, and their symbols only cost image size.
func goBuild(ctx context.Context, dir, out, pkg string, f goFlags) error {
	env := append(buildEnv()[:3:3], "GOFLAGS=-buildvcs=false")
	args := []string{"build", "-trimpath", "-ldflags=-s -w -buildid= " + f.ldflags, "-o", out}
	if f.tags != "" {
		args = append(args, "-tags", f.tags)
	}
	return run(ctx, dir, env, "go", append(args, pkg)...)
}

// moduleVersion is the version of module that the go.mod in dir requires.
func moduleVersion(ctx context.Context, dir, module string) (string, error) {
	v, err := moduleField(ctx, dir, module, "{{.Version}}")
	if err == nil && v == "" {
		err = fmt.Errorf("%s/go.mod does not require %s", dir, module)
	}
	return v, err
}

// moduleField is `go list -m -f format module` in dir.
func moduleField(ctx context.Context, dir, module, format string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", format, module)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go list -m %s in %s: %w\n%s", module, dir, err, stderr.Bytes())
	}
	return strings.TrimSpace(stdout.String()), nil
}

// run runs a build command with env added to the environment; its output
// is returned in the error when it fails.
func run(ctx context.Context, dir string, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s (in %s, %s): %w\n%s", name, strings.Join(args, " "), dir, strings.Join(env, " "), err, out)
	}
	return nil
}

// checkStatic refuses a binary the images could not run: they hold no
// dynamic loader and no libc.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	if slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
		return fmt.Errorf("%s is dynamically linked (it names an ELF interpreter); the image has none", path)
	}
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("%s is built for %v, the image is linux/amd64", path, f.Machine)
	}
	return nil
}

// nonrootUID is distroless's "nonroot" user and group, which the
// Dockerfile's runtime image provides and the pods run as.
const nonrootUID = 65532

// cachetierSpec is the Dockerfile's runtime stage restated: what
// gcr.io/distroless/static-debian12:nonroot contributes that the binaries
// use (the nonroot user in /etc/passwd and /etc/group, its home, /tmp, the
// working directory and PATH), then the stage's own COPY, LABEL, USER and
// ENTRYPOINT. CA certificates and tzdata are left out: both binaries only
// talk TLS with cluster CAs they are given, and log in UTC.
func cachetierSpec(binDir string) ociimage.Spec {
	return ociimage.Spec{
		Files: []ociimage.File{
			{Path: "/manager", Mode: 0o755, Source: filepath.Join(binDir, "manager")},
			{Path: "/cache-server", Mode: 0o755, Source: filepath.Join(binDir, "cache-server")},
			{Path: "/etc/passwd", Mode: 0o644, Content: []byte(passwd)},
			{Path: "/etc/group", Mode: 0o644, Content: []byte(group)},
			{Path: "/home/nonroot", Mode: fs.ModeDir | 0o700, UID: nonrootUID, GID: nonrootUID},
			{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		},
		Config: ociimage.Config{
			User:       fmt.Sprintf("%d:%d", nonrootUID, nonrootUID),
			Entrypoint: []string{"/manager"},
			Env:        []string{defaultPath},
			WorkingDir: "/home/nonroot",
			Labels: map[string]string{
				"org.opencontainers.image.source":      "https://github.com/cachetier/cachetier",
				"org.opencontainers.image.description": "cachetier operator and cache-server",
				"org.opencontainers.image.licenses":    "Apache-2.0",
			},
		},
	}
}

// passwd and group are distroless static's, which name root, nobody and
// nonroot.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
)

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// pauseUID is the user of upstream's pause image (registry.k8s.io/pause),
// kept so the sandbox runs as the kubelet's users are used to.
const pauseUID = 65535

func pauseSpec(binDir string) ociimage.Spec {
	return binarySpec(binDir, "pause", pauseUID, map[string]string{
		"org.opencontainers.image.source":      "https://github.com/cachetier/cachetier",
		"org.opencontainers.image.description": "cachetier test node sandbox (pause) image",
	})
}

func corednsSpec(binDir, version string) ociimage.Spec {
	return binarySpec(binDir, "coredns", nonrootUID, map[string]string{
		"org.opencontainers.image.source":      "https://github.com/coredns/coredns",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.description": "CoreDNS " + version + " with cluster DNS plugins only (cachetier hack/coredns-build)",
	})
}

// binarySpec is an image of one static binary, /<name>, its entrypoint,
// run as uid:uid (numeric: no /etc/passwd needed).
func binarySpec(binDir, name string, uid int, labels map[string]string) ociimage.Spec {
	return binaryAt(binDir, name, "/"+name, uid, labels)
}

// binaryAt is binarySpec with the binary (binDir/name) at path.
func binaryAt(binDir, name, path string, uid int, labels map[string]string) ociimage.Spec {
	return ociimage.Spec{
		Files: []ociimage.File{{Path: path, Mode: 0o755, Source: filepath.Join(binDir, name)}},
		Config: ociimage.Config{
			User:       fmt.Sprintf("%d:%d", uid, uid),
			Entrypoint: []string{path},
			Labels:     labels,
		},
	}
}

// EnvImages names a directory with images.json (what `make image` writes);
// test packages use its images instead of each building its own.
const EnvImages = "CACHETIER_IMAGES"

// Prebuilt returns the images named from $CACHETIER_IMAGES when it is set
// (an error if any is missing there), else builds them into out.
func Prebuilt(ctx context.Context, out string, log io.Writer, names ...string) ([]Image, error) {
	dir := os.Getenv(EnvImages)
	if dir == "" {
		return Build(ctx, Options{Out: out, Images: names, Log: log})
	}
	all, err := ReadManifest(dir)
	if err != nil {
		return nil, fmt.Errorf("%s=%s: %w (run `make image`)", EnvImages, dir, err)
	}
	var images []Image
	for _, name := range names {
		img, ok := Find(all, name)
		if !ok {
			return nil, fmt.Errorf("%s=%s has no %s image (run `make image`)", EnvImages, dir, name)
		}
		images = append(images, img)
	}
	return images, nil
}

// Find returns the image called name.
func Find(images []Image, name string) (Image, bool) {
	for _, img := range images {
		if img.Name == name {
			return img, true
		}
	}
	return Image{}, false
}
