// Package promapi reads a Prometheus server's HTTP API for tests: instant
// and range queries, label values, targets, rules and alerts. The tests
// that prove the dashboards and alerts use it, so that every query is
// evaluated by Prometheus itself (e2e/observability: the operator-managed
// Prometheus on the test node).
package promapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Client calls one Prometheus.
type Client struct {
	// URL is the API's base, e.g. http://100.64.1.5:9090.
	URL  string
	http *http.Client
}

// New returns a client for the Prometheus at url.
func New(url string) *Client {
	return &Client{URL: url, http: &http.Client{Timeout: 30 * time.Second}}
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
func (c *Client) get(ctx context.Context, path string, params url.Values, out any) error {
	u := c.URL + path
	if len(params) > 0 {
		u += "?" + params.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
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
func (c *Client) Query(ctx context.Context, expr string) ([]Sample, error) {
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := c.get(ctx, "/api/v1/query", url.Values{"query": {expr}}, &d); err != nil {
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
func (c *Client) QueryRange(ctx context.Context, expr string, start, end time.Time, step time.Duration) ([]Series, error) {
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
	if err := c.get(ctx, "/api/v1/query_range", params, &d); err != nil {
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
func (c *Client) LabelValues(ctx context.Context, label, selector string) ([]string, error) {
	var out []string
	err := c.get(ctx, "/api/v1/label/"+url.PathEscape(label)+"/values", url.Values{"match[]": {selector}}, &out)
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
func (c *Client) Targets(ctx context.Context) ([]Target, error) {
	var d struct {
		Active []Target `json:"activeTargets"`
	}
	err := c.get(ctx, "/api/v1/targets", url.Values{"state": {"active"}}, &d)
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
func (c *Client) Alerts(ctx context.Context) ([]Alert, error) {
	var d struct {
		Alerts []Alert `json:"alerts"`
	}
	err := c.get(ctx, "/api/v1/alerts", nil, &d)
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
func (c *Client) Rules(ctx context.Context) ([]Rule, error) {
	var d struct {
		Groups []struct {
			Name  string `json:"name"`
			File  string `json:"file"`
			Rules []Rule `json:"rules"`
		} `json:"groups"`
	}
	if err := c.get(ctx, "/api/v1/rules", nil, &d); err != nil {
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
