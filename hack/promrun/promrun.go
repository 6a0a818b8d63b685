// Package promrun runs a real Prometheus server (Debian's prometheus
// package, /usr/bin/prometheus) as a process on loopback for tests, and
// reads its HTTP API: instant and range queries, label values, targets,
// rules and alerts. The tests that prove the dashboards and alerts use it so
// that every query is evaluated by Prometheus itself.
package promrun

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/cachetier/cachetier/hack/controlplane"
)

// Binary is Debian's Prometheus; `make test-deps` installs the package
// (it ships promtool as well).
const Binary = "/usr/bin/prometheus"

// Server is a running Prometheus.
type Server struct {
	// URL is its HTTP API's base, http://127.0.0.1:PORT.
	URL     string
	LogPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	client  *http.Client
}

// Start runs Prometheus with the configuration file config, its data under
// dir, listening on a free loopback port, and waits until it is ready.
func Start(ctx context.Context, config, dir string) (*Server, error) {
	if _, err := os.Stat(Binary); err != nil {
		return nil, fmt.Errorf("%s: %w (install Debian's prometheus package: make test-deps)", Binary, err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "prometheus.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s := &Server{
		URL:     fmt.Sprintf("http://127.0.0.1:%d", port),
		LogPath: logPath,
		exited:  make(chan struct{}),
		client:  &http.Client{Timeout: 30 * time.Second},
	}
	s.cmd = exec.Command(Binary,
		"--config.file="+config,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port),
		"--web.enable-lifecycle",
		"--log.level=info",
	)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	// Its own process group, so that a test's interrupt reaches it only
	// through Stop.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.waitErr = s.cmd.Wait(); close(s.exited) }()
	if err := s.waitReady(ctx, time.Minute); err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		select {
		case <-s.exited:
			return fmt.Errorf("prometheus exited: %v\n%s", s.waitErr, controlplane.LogTail(s.LogPath, 20))
		default:
		}
		if resp, err := s.client.Get(s.URL + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("prometheus not ready after %s\n%s", timeout, controlplane.LogTail(s.LogPath, 20))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop ends the process (SIGTERM, then SIGKILL after 10 s).
func (s *Server) Stop() error {
	select {
	case <-s.exited:
		return nil
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	return nil
}

// Exited reports an error when the process has ended.
func (s *Server) Exited() error {
	select {
	case <-s.exited:
		return fmt.Errorf("prometheus exited: %v\n%s", s.waitErr, controlplane.LogTail(s.LogPath, 20))
	default:
		return nil
	}
}

// apiResponse is the envelope of every /api/v1 answer.
type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
	Warnings  []string        `json:"warnings"`
}

// get calls an /api/v1 endpoint and decodes its data into out.
func (s *Server) get(ctx context.Context, path string, params url.Values, out any) error {
	u := s.URL + path
	if len(params) > 0 {
		u += "?" + params.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r apiResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("GET %s: HTTP %d: %s", path, resp.StatusCode, bytes.TrimSpace(body))
	}
	if r.Status != "success" {
		return fmt.Errorf("GET %s %s: %s: %s", path, params.Encode(), r.ErrorType, r.Error)
	}
	return json.Unmarshal(r.Data, out)
}

// Sample is one series of an instant vector.
type Sample struct {
	Metric map[string]string
	Value  float64
}

// Series is one series of a range query.
type Series struct {
	Metric map[string]string
	Times  []time.Time
	Values []float64
}

// Query evaluates expr now; a scalar answers as one sample without labels.
func (s *Server) Query(ctx context.Context, expr string) ([]Sample, error) {
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := s.get(ctx, "/api/v1/query", url.Values{"query": {expr}}, &d); err != nil {
		return nil, err
	}
	switch d.ResultType {
	case "vector":
		var v []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(d.Result, &v); err != nil {
			return nil, err
		}
		out := make([]Sample, 0, len(v))
		for _, x := range v {
			f, err := parseValue(x.Value[1])
			if err != nil {
				return nil, err
			}
			out = append(out, Sample{Metric: x.Metric, Value: f})
		}
		return out, nil
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(d.Result, &v); err != nil {
			return nil, err
		}
		f, err := parseValue(v[1])
		return []Sample{{Value: f}}, err
	default:
		return nil, fmt.Errorf("query %q: result type %s", expr, d.ResultType)
	}
}

// QueryRange evaluates expr from start to end at step.
func (s *Server) QueryRange(ctx context.Context, expr string, start, end time.Time, step time.Duration) ([]Series, error) {
	var d struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Values [][2]any          `json:"values"`
		} `json:"result"`
	}
	params := url.Values{
		"query": {expr},
		"start": {strconv.FormatInt(start.Unix(), 10)},
		"end":   {strconv.FormatInt(end.Unix(), 10)},
		"step":  {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)},
	}
	if err := s.get(ctx, "/api/v1/query_range", params, &d); err != nil {
		return nil, err
	}
	out := make([]Series, 0, len(d.Result))
	for _, r := range d.Result {
		ser := Series{Metric: r.Metric}
		for _, p := range r.Values {
			ts, ok := p[0].(float64)
			if !ok {
				return nil, fmt.Errorf("query_range %q: timestamp %v", expr, p[0])
			}
			f, err := parseValue(p[1])
			if err != nil {
				return nil, err
			}
			ser.Times = append(ser.Times, time.Unix(0, int64(ts*1e9)))
			ser.Values = append(ser.Values, f)
		}
		out = append(out, ser)
	}
	return out, nil
}

// parseValue reads a sample value, which the API sends as a string
// ("NaN", "+Inf" included).
func parseValue(v any) (float64, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("sample value %v is not a string", v)
	}
	return strconv.ParseFloat(s, 64)
}

// LabelValues are the values of label on the series that match selector
// (what Grafana's label_values(selector, label) asks).
func (s *Server) LabelValues(ctx context.Context, label, selector string) ([]string, error) {
	var out []string
	err := s.get(ctx, "/api/v1/label/"+url.PathEscape(label)+"/values", url.Values{"match[]": {selector}}, &out)
	return out, err
}

// Target is one scrape target's state.
type Target struct {
	ScrapePool string            `json:"scrapePool"`
	ScrapeURL  string            `json:"scrapeUrl"`
	Labels     map[string]string `json:"labels"`
	Health     string            `json:"health"`
	LastError  string            `json:"lastError"`
}

// Targets are the active scrape targets.
func (s *Server) Targets(ctx context.Context) ([]Target, error) {
	var d struct {
		Active []Target `json:"activeTargets"`
	}
	err := s.get(ctx, "/api/v1/targets", url.Values{"state": {"active"}}, &d)
	return d.Active, err
}

// Alert is an alert Prometheus holds (pending or firing).
type Alert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
	ActiveAt    time.Time         `json:"activeAt"`
}

// Alerts are the pending and firing alerts.
func (s *Server) Alerts(ctx context.Context) ([]Alert, error) {
	var d struct {
		Alerts []Alert `json:"alerts"`
	}
	err := s.get(ctx, "/api/v1/alerts", nil, &d)
	return d.Alerts, err
}

// Rule is one loaded alerting rule and its last evaluation.
type Rule struct {
	Name      string  `json:"name"`
	Query     string  `json:"query"`
	Duration  float64 `json:"duration"`
	Health    string  `json:"health"`
	LastError string  `json:"lastError"`
	State     string  `json:"state"`
	Type      string  `json:"type"`
	File      string  `json:"-"`
}

// Rules are the loaded rules, with the file of their group.
func (s *Server) Rules(ctx context.Context) ([]Rule, error) {
	var d struct {
		Groups []struct {
			Name  string `json:"name"`
			File  string `json:"file"`
			Rules []Rule `json:"rules"`
		} `json:"groups"`
	}
	if err := s.get(ctx, "/api/v1/rules", nil, &d); err != nil {
		return nil, err
	}
	var out []Rule
	for _, g := range d.Groups {
		for _, r := range g.Rules {
			r.File = g.File
			out = append(out, r)
		}
	}
	return out, nil
}
