package kubectl

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

var (
	rywIterations = flag.Int("ryw.iterations", 500, "write+read iterations per phase of TestReadYourWrites")
	rywQuietBusy  = flag.Int("ryw.quiet-busy-iterations", 10, "iterations of the quiet-resource-on-a-busy-cluster phase")
	rywReport     = flag.Bool("ryw.report", os.Getenv("CACHETIER_RYW_REPORT") != "", "print the freshness-wait percentiles of TestReadYourWrites (also CACHETIER_RYW_REPORT=1)")
)

// TestReadYourWrites: a write acknowledged by the apiserver is visible to
// the very next consistent read (resourceVersion unset) through the tier,
// LIST and GET, on a busy resource (another writer keeps updating other
// objects of the same resource) and on a quiet one. The test asserts
// correctness only; -ryw.report prints the latencies.
func TestReadYourWrites(t *testing.T) {
	api := kubernetes.NewForConfigOrDie(env.Admin)
	tierCfg := rest.CopyConfig(env.TierAdmin)
	tierCfg.QPS, tierCfg.Burst = 1000, 2000
	tier := kubernetes.NewForConfigOrDie(tierCfg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// busyWriter updates 50 configmaps of ns-3 in a loop until stopped and
	// returns how many updates it made.
	busyWriter := func() (stop func() int64) {
		bgCtx, cancel := context.WithCancel(ctx)
		var n atomic.Int64
		var wg sync.WaitGroup
		for w := 0; w < 2; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; bgCtx.Err() == nil; i += 2 {
					name := fmt.Sprintf("cm-%03d", i%50)
					cm, err := api.CoreV1().ConfigMaps("ns-3").Get(bgCtx, name, metav1.GetOptions{})
					if err != nil {
						continue
					}
					cm.Data["tick"] = strconv.Itoa(i)
					if _, err := api.CoreV1().ConfigMaps("ns-3").Update(bgCtx, cm, metav1.UpdateOptions{}); err == nil {
						n.Add(1)
					}
				}
			}()
		}
		return func() int64 {
			cancel()
			wg.Wait()
			return n.Load()
		}
	}
	cms := &configMapRW{api: api.CoreV1().ConfigMaps("ns-0"), tier: tier.CoreV1().ConfigMaps("ns-0")}
	secrets := &secretRW{api: api.CoreV1().Secrets("ns-0"), tier: tier.CoreV1().Secrets("ns-0")}

	var reports []rywReportRow
	t.Run("busy resource", func(t *testing.T) {
		// Other configmaps are updated continuously while the test writes
		// and reads its own.
		stop := busyWriter()
		reports = append(reports, runRYW(t, ctx, "configmaps", "busy", *rywIterations, cms))
		n := stop()
		t.Logf("background writer: %d updates of other configmaps during the phase", n)
		if n < int64(*rywIterations) {
			t.Errorf("the background writer made only %d writes; the resource was not busy", n)
		}
	})
	t.Run("quiet resource", func(t *testing.T) {
		// Nothing else writes (the apiserver's own lease updates aside).
		reports = append(reports, runRYW(t, ctx, "secrets", "quiet", *rywIterations, secrets))
	})
	t.Run("quiet resource, busy cluster", func(t *testing.T) {
		// Secrets stay quiet while configmaps are busy: the apiserver's
		// current RV moves past the secrets stream's last event, so a
		// consistent read of secrets needs a proof of progress.
		stop := busyWriter()
		reports = append(reports, runRYW(t, ctx, "secrets", "quiet-busy", *rywQuietBusy, secrets))
		t.Logf("background writer: %d updates of configmaps during the phase", stop())
	})
	if *rywReport || testing.Verbose() {
		var b strings.Builder
		fmt.Fprintf(&b, "\nread-your-writes: consistent LIST + GET through the tier right after each write\n")
		fmt.Fprintf(&b, "%-11s %-5s %-10s %-6s %10s %10s %10s   %s\n", "phase", "iter", "resource", "read", "p50", "p99", "max", "server freshness wait (histogram estimate) p50 / p99")
		for _, r := range reports {
			for _, kind := range []string{"LIST", "GET"} {
				lat := r.list
				if kind == "GET" {
					lat = r.get
				}
				fmt.Fprintf(&b, "%-11s %5d %-10s %-6s %10s %10s %10s", r.phase, r.iterations, r.resource, kind, pct(lat, 0.50), pct(lat, 0.99), pct(lat, 1))
				if kind == "LIST" {
					fmt.Fprintf(&b, "   %s / %s (%.0f reads)", r.serverP50, r.serverP99, r.serverCount)
				}
				b.WriteString("\n")
			}
		}
		if *rywReport {
			fmt.Fprint(os.Stderr, b.String())
		} else {
			t.Log(b.String())
		}
	}
}

// objectRW writes one object through the apiserver and reads it back through
// the tier; each returns the resourceVersion it saw.
type objectRW interface {
	write(ctx context.Context, name string, iter int) (string, error)
	// list returns the RV of name in a consistent LIST of the label, or "".
	list(ctx context.Context, label, name string) (string, error)
	get(ctx context.Context, name string) (string, error)
}

type rywReportRow struct {
	phase, resource      string
	iterations           int
	list, get            []time.Duration
	serverP50, serverP99 string
	serverCount          float64
}

func runRYW(t *testing.T, ctx context.Context, resource, phase string, iterations int, rw objectRW) rywReportRow {
	row := rywReportRow{phase: phase, resource: resource, iterations: iterations}
	before := scrapeFreshness(t, resource)
	for i := 0; i < iterations; i++ {
		name := fmt.Sprintf("ryw-%s-%d", phase, i%20)
		label := "ryw=" + phase
		rv, err := rw.write(ctx, name, i)
		if err != nil {
			t.Fatalf("iteration %d: write %s: %v", i, name, err)
		}
		start := time.Now()
		gotList, err := rw.list(ctx, label, name)
		row.list = append(row.list, time.Since(start))
		if err != nil {
			t.Fatalf("iteration %d: consistent LIST through the tier: %v", i, err)
		}
		if gotList != rv {
			t.Fatalf("iteration %d: wrote %s at RV %s; the consistent LIST right after shows RV %q", i, name, rv, gotList)
		}
		start = time.Now()
		gotGet, err := rw.get(ctx, name)
		row.get = append(row.get, time.Since(start))
		if err != nil {
			t.Fatalf("iteration %d: consistent GET through the tier: %v", i, err)
		}
		if gotGet != rv {
			t.Fatalf("iteration %d: wrote %s at RV %s; the consistent GET right after shows RV %s", i, name, rv, gotGet)
		}
	}
	after := scrapeFreshness(t, resource)
	delta := after.minus(before)
	row.serverCount = delta.count
	row.serverP50, row.serverP99 = delta.quantile(0.5), delta.quantile(0.99)
	return row
}

type configMapRW struct {
	api, tier interface {
		Create(context.Context, *corev1.ConfigMap, metav1.CreateOptions) (*corev1.ConfigMap, error)
		Update(context.Context, *corev1.ConfigMap, metav1.UpdateOptions) (*corev1.ConfigMap, error)
		Get(context.Context, string, metav1.GetOptions) (*corev1.ConfigMap, error)
		List(context.Context, metav1.ListOptions) (*corev1.ConfigMapList, error)
	}
	last map[string]*corev1.ConfigMap
}

func (c *configMapRW) write(ctx context.Context, name string, iter int) (string, error) {
	if c.last == nil {
		c.last = map[string]*corev1.ConfigMap{}
	}
	var out *corev1.ConfigMap
	var err error
	if prev := c.last[name]; prev != nil {
		prev.Data["iteration"] = strconv.Itoa(iter)
		out, err = c.api.Update(ctx, prev, metav1.UpdateOptions{})
	} else {
		out, err = c.api.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"ryw": phaseOf(name)}},
			Data:       map[string]string{"iteration": strconv.Itoa(iter)},
		}, metav1.CreateOptions{})
	}
	if err != nil {
		return "", err
	}
	c.last[name] = out
	return out.ResourceVersion, nil
}

func (c *configMapRW) list(ctx context.Context, label, name string) (string, error) {
	l, err := c.tier.List(ctx, metav1.ListOptions{LabelSelector: label})
	if err != nil {
		return "", err
	}
	for _, it := range l.Items {
		if it.Name == name {
			return it.ResourceVersion, nil
		}
	}
	return "", nil
}

func (c *configMapRW) get(ctx context.Context, name string) (string, error) {
	o, err := c.tier.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return o.ResourceVersion, nil
}

type secretRW struct {
	api, tier interface {
		Create(context.Context, *corev1.Secret, metav1.CreateOptions) (*corev1.Secret, error)
		Update(context.Context, *corev1.Secret, metav1.UpdateOptions) (*corev1.Secret, error)
		Get(context.Context, string, metav1.GetOptions) (*corev1.Secret, error)
		List(context.Context, metav1.ListOptions) (*corev1.SecretList, error)
	}
	last map[string]*corev1.Secret
}

func (c *secretRW) write(ctx context.Context, name string, iter int) (string, error) {
	if c.last == nil {
		c.last = map[string]*corev1.Secret{}
	}
	var out *corev1.Secret
	var err error
	if prev := c.last[name]; prev != nil {
		prev.Data["iteration"] = []byte(strconv.Itoa(iter))
		out, err = c.api.Update(ctx, prev, metav1.UpdateOptions{})
	} else {
		out, err = c.api.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"ryw": phaseOf(name)}},
			Data:       map[string][]byte{"iteration": []byte(strconv.Itoa(iter))},
		}, metav1.CreateOptions{})
	}
	if err != nil {
		return "", err
	}
	c.last[name] = out
	return out.ResourceVersion, nil
}

func (c *secretRW) list(ctx context.Context, label, name string) (string, error) {
	l, err := c.tier.List(ctx, metav1.ListOptions{LabelSelector: label})
	if err != nil {
		return "", err
	}
	for _, it := range l.Items {
		if it.Name == name {
			return it.ResourceVersion, nil
		}
	}
	return "", nil
}

func (c *secretRW) get(ctx context.Context, name string) (string, error) {
	o, err := c.tier.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return o.ResourceVersion, nil
}

func pct(d []time.Duration, q float64) string {
	if len(d) == 0 {
		return "-"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	i = max(0, min(i, len(s)-1))
	return fmtDur(s[i])
}

func fmtDur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}

// histogram is the cumulative cachetier_freshness_wait_seconds buckets of
// one resource, summed over outcomes.
type histogram struct {
	bounds []float64 // upper bounds, +Inf last
	counts map[float64]float64
	count  float64
}

var bucketLine = regexp.MustCompile(`^cachetier_freshness_wait_seconds_bucket\{(.*)\} ([0-9.e+]+)$`)

func scrapeFreshness(t *testing.T, resource string) histogram {
	t.Helper()
	client, err := rest.HTTPClientFor(env.TierAdmin)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Get(env.TierURL + "/metrics")
	if err != nil {
		t.Fatalf("scrape the tier: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape the tier: %s", resp.Status)
	}
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	h := histogram{counts: map[float64]float64{}}
	sc := bufio.NewScanner(&buf)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := bucketLine.FindStringSubmatch(sc.Text())
		if m == nil || !strings.Contains(m[1], `resource="`+resource+`"`) {
			continue
		}
		le := regexp.MustCompile(`le="([^"]+)"`).FindStringSubmatch(m[1])
		if le == nil {
			continue
		}
		bound, err := strconv.ParseFloat(le[1], 64)
		if err != nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[2], 64)
		if _, ok := h.counts[bound]; !ok {
			h.bounds = append(h.bounds, bound)
		}
		h.counts[bound] += v
	}
	slices.Sort(h.bounds)
	if n := len(h.bounds); n > 0 {
		h.count = h.counts[h.bounds[n-1]]
	}
	return h
}

func (h histogram) minus(o histogram) histogram {
	out := histogram{bounds: h.bounds, counts: map[float64]float64{}}
	for _, b := range h.bounds {
		out.counts[b] = h.counts[b] - o.counts[b]
	}
	out.count = h.count - o.count
	return out
}

// quantile estimates as Prometheus' histogram_quantile does (linear
// interpolation inside the bucket).
func (h histogram) quantile(q float64) string {
	if h.count == 0 {
		return "-"
	}
	rank := q * h.count
	prevBound, prevCount := 0.0, 0.0
	for _, b := range h.bounds {
		c := h.counts[b]
		if c >= rank {
			if math.IsInf(b, 1) {
				return fmt.Sprintf("> %s", fmtDur(time.Duration(prevBound*float64(time.Second))))
			}
			v := prevBound + (b-prevBound)*(rank-prevCount)/math.Max(c-prevCount, 1e-9)
			return fmtDur(time.Duration(v * float64(time.Second)))
		}
		prevBound, prevCount = b, c
	}
	return "-"
}

// phaseOf is the label value of an object named ryw-<phase>-<n>.
func phaseOf(name string) string {
	return strings.TrimPrefix(name[:strings.LastIndex(name, "-")], "ryw-")
}
