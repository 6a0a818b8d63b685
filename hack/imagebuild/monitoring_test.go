package imagebuild

import (
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestPrometheusRelease(t *testing.T) {
	for in, want := range map[string]string{"v0.316.0": "3.16.0", "v0.300.1": "3.0.1", "v0.405.2": "4.5.2"} {
		if got, err := PrometheusRelease(in); err != nil || got != want {
			t.Errorf("PrometheusRelease(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	// 2.x module versions (v0.5x.y) name no release, nor do malformed ones.
	for _, in := range []string{"v0.55.1", "v2.53.0", "0.316.0", "v0.316", "v0.316.x", "v0.3a6.0", ""} {
		if got, err := PrometheusRelease(in); err == nil {
			t.Errorf("PrometheusRelease(%q) = %q, want an error", in, got)
		}
	}
}

// TestMonitoringImages: the operator, reloader and Prometheus images are
// laid out as the Prometheus Operator runs upstream's (the reloader's path
// is hard-coded in the operator; the Prometheus container gets only
// arguments), and each binary reports the version its build module pins.
// Uses the images `make image` built when $CACHETIER_IMAGES is set.
func TestMonitoringImages(t *testing.T) {
	images, err := Prebuilt(t.Context(), t.TempDir(), nil, PromOperator, ConfigReloader, Prometheus)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		img            Image
		path, version  string
		repo, workdir  string
		versionCommand []string
	}{
		{images[0], "/bin/operator", "0.85.0", promOperatorRepo, "", []string{"--version"}},
		{images[1], "/bin/prometheus-config-reloader", "0.85.0", configReloaderRepo, "", []string{"--version"}},
		{images[2], "/bin/prometheus", "3.16.0", prometheusRepo, "/prometheus", []string{"--version"}},
	} {
		t.Run(c.img.Name, func(t *testing.T) {
			got := readImage(t, c.img)
			cfg := got.config.Config
			if cfg.User != "65534:65534" || !reflect.DeepEqual(cfg.Entrypoint, []string{c.path}) || cfg.WorkingDir != c.workdir {
				t.Errorf("config user %q entrypoint %q workdir %q; want 65534:65534, [%s], %q", cfg.User, cfg.Entrypoint, cfg.WorkingDir, c.path, c.workdir)
			}
			if f, ok := got.files[c.path]; !ok || f.mode != 0o755 {
				t.Errorf("%s: %+v (present %v)", c.path, f, ok)
			}
			if c.workdir != "" {
				if f := got.files[c.workdir]; !f.dir || f.uid != nobodyUID {
					t.Errorf("%s: %+v, want a directory owned by nobody", c.workdir, f)
				}
			}
			if !strings.HasPrefix(c.img.Ref, c.repo+":v"+c.version+"-") {
				t.Errorf("ref %s, want %s:v%s-<digest>", c.img.Ref, c.repo, c.version)
			}
			bin := filepath.Join(filepath.Dir(c.img.Tar), "build", c.img.Name, filepath.Base(c.path))
			if err := checkStatic(bin); err != nil {
				t.Error(err)
			}
			out, _ := exec.Command(bin, c.versionCommand...).CombinedOutput()
			if !strings.Contains(string(out), "version "+c.version) && !strings.Contains(string(out), "Version: "+c.version) {
				t.Errorf("%s %s printed %q; want version %s", bin, strings.Join(c.versionCommand, " "), out, c.version)
			}
		})
	}
}
