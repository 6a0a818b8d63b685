// Command bundlegen renders the OLM bundle (bundle/ and bundle.Dockerfile)
// from config/manifests. operator-sdk is not available in this project's
// build environment; this generator covers what `operator-sdk generate
// bundle` would do for this operator and nothing more.
//
// Usage (from the repository root): go run ./hack/bundlegen [-root .] [-check]
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/blang/semver/v4"
)

func main() {
	root := flag.String("root", ".", "repository root")
	check := flag.Bool("check", false, "only report whether the committed bundle is up to date")
	flag.Parse()
	files, err := Generate(*root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bundlegen:", err)
		os.Exit(1)
	}
	if *check {
		if diffs := Diff(*root, files); len(diffs) > 0 {
			fmt.Fprintf(os.Stderr, "bundle is out of date (run make bundle): %v\n", diffs)
			os.Exit(1)
		}
		return
	}
	if err := Write(*root, files); err != nil {
		fmt.Fprintln(os.Stderr, "bundlegen:", err)
		os.Exit(1)
	}
}

func parseVersion(v string) (semver.Version, error) { return semver.Parse(v) }

// generatedDirs are owned entirely by the generator: files in them that it
// did not produce are stale and removed.
func generatedDirs() []string { return []string{manifestsDir, metadataDir} }

// Write replaces the bundle with files.
func Write(root string, files map[string][]byte) error {
	for _, d := range generatedDirs() {
		if err := os.RemoveAll(filepath.Join(root, d)); err != nil {
			return err
		}
	}
	for p, b := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Diff lists the paths whose committed content differs from files,
// including stale files in the generated directories.
func Diff(root string, files map[string][]byte) []string {
	var diffs []string
	for p, b := range files {
		have, err := os.ReadFile(filepath.Join(root, p))
		if err != nil || !bytes.Equal(have, b) {
			diffs = append(diffs, p)
		}
	}
	for _, d := range generatedDirs() {
		_ = filepath.WalkDir(filepath.Join(root, d), func(p string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return nil
			}
			rel, _ := filepath.Rel(root, p)
			if _, ok := files[filepath.ToSlash(rel)]; !ok {
				diffs = append(diffs, rel+" (stale)")
			}
			return nil
		})
	}
	sort.Strings(diffs)
	return diffs
}
