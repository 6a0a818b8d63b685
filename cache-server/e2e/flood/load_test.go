package flood

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/internal/pki"
)

// identity is a user of the test, with a client certificate from the
// cluster CA: the tier authenticates it as the apiserver does.
type identity struct {
	name            string
	groups          []string
	cert            tls.Certificate
	certPEM, keyPEM []byte
}

func newIdentity(ca *pki.CA, name string, groups ...string) (identity, error) {
	kp, err := ca.IssueClient(name, groups)
	if err != nil {
		return identity{}, err
	}
	cert, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	return identity{name: name, groups: groups, cert: cert, certPEM: kp.CertPEM, keyPEM: kp.KeyPEM}, err
}

// target is a server the test sends requests to.
type target struct {
	url        string
	ca         []byte
	serverName string
}

// client is an HTTP client of id to t on a connection of its own (HTTP/2
// multiplexes at most 250 streams on one; a flood needs more).
func (t target) client(id identity) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(t.ca)
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: t.serverName, Certificates: []tls.Certificate{id.cert}},
		ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 1000,
	}}
}

// clientset is a client-go clientset of id to t, as a controller uses
// (it retries a 429 or 5xx that carries Retry-After, as client-go does);
// every HTTP response it gets is added to seen.
func (t target) clientset(id identity, seen *record) (kubernetes.Interface, error) {
	cfg := &rest.Config{Host: t.url, QPS: 1000, Burst: 1000,
		TLSClientConfig: rest.TLSClientConfig{CAData: t.ca, ServerName: t.serverName, CertData: id.certPEM, KeyData: id.keyPEM}}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if err == nil {
				seen.add(newAnswer(resp))
			}
			return resp, err
		})
	})
	return kubernetes.NewForConfig(cfg)
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// call times a client-go call as an answer (200 when it succeeded).
func call(fn func() error) answer {
	start := time.Now()
	err := fn()
	a := answer{code: http.StatusOK, latency: time.Since(start), err: err}
	if err != nil {
		a.code = 0
	}
	return a
}

// answer is what the test keeps of a response.
type answer struct {
	code        int
	retryAfter  string
	contentType string
	body        string // error bodies only
	pfFlow      string // X-Kubernetes-PF-FlowSchema-UID
	pfLevel     string // X-Kubernetes-PF-PriorityLevel-UID
	latency     time.Duration
	err         error
}

// newAnswer keeps the status and the headers priority and fairness sets
// (on every answer it classified, 429s included).
func newAnswer(resp *http.Response) answer {
	return answer{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), contentType: resp.Header.Get("Content-Type"),
		pfFlow: resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID"), pfLevel: resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID")}
}

// send GETs path. The answer is complete (done) unless the response is a
// 200, whose body the caller reads and closes; start is when it was sent.
func send(ctx context.Context, c *http.Client, base, path string) (resp *http.Response, a answer, start time.Time, done bool) {
	start = time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return nil, answer{err: err}, start, true
	}
	resp, err = c.Do(req)
	if err != nil {
		return nil, answer{err: err, latency: time.Since(start)}, start, true
	}
	a = newAnswer(resp)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		a.body, a.latency = string(b), time.Since(start)
		return nil, a, start, true
	}
	return resp, a, start, false
}

// get sends a GET of path and reads the whole body (a flood reads what it
// asked for; discarding would let the server skip the work).
func get(ctx context.Context, c *http.Client, base, path string) answer {
	resp, a, start, done := send(ctx, c, base, path)
	if done {
		return a
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		a.err = err
	}
	a.latency = time.Since(start)
	return a
}

// watchUntilInitialEnd opens a watch-list of path and reads it up to its
// initial-events-end bookmark.
func watchUntilInitialEnd(ctx context.Context, c *http.Client, base, path string) answer {
	resp, a, start, done := send(ctx, c, base, path)
	if done {
		return a
	}
	defer resp.Body.Close()
	buf := make([]byte, 64<<10)
	var tail []byte
	for {
		n, err := resp.Body.Read(buf)
		tail = append(tail[max(0, len(tail)-200):], buf[:n]...)
		if strings.Contains(string(tail), `"k8s.io/initial-events-end":"true"`) {
			break
		}
		if err != nil {
			a.err = fmt.Errorf("watch-list ended before its initial-events-end bookmark: %w", err)
			break
		}
	}
	a.latency = time.Since(start)
	return a
}

// record collects the answers of one class of client.
type record struct {
	mu      sync.Mutex
	answers []answer
}

func (r *record) add(a answer) {
	r.mu.Lock()
	r.answers = append(r.answers, a)
	r.mu.Unlock()
}

// summary of a record: answers by code, transport errors, latency
// quantiles of the 200s.
type summary struct {
	total, ok, tooMany, other, errs int
	p50, p99, max                   time.Duration
	firstOther                      string
	// responded counts the answers whose status and headers arrived,
	// errors while reading a body after them included (a flooder's LIST
	// cut when the flood ends).
	responded int
	// levels counts the answers by the priority level that classified
	// them (X-Kubernetes-PF-PriorityLevel-UID).
	levels map[string]int
}

func (r *record) summary() summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := summary{levels: map[string]int{}}
	var lat []time.Duration
	for _, a := range r.answers {
		s.total++
		if a.code != 0 {
			s.responded++
		}
		if a.pfLevel != "" {
			s.levels[a.pfLevel]++
		}
		switch {
		case a.err != nil:
			s.errs++
			if s.firstOther == "" {
				s.firstOther = a.err.Error()
			}
		case a.code == http.StatusOK:
			s.ok++
			lat = append(lat, a.latency)
		case a.code == http.StatusTooManyRequests:
			s.tooMany++
		default:
			s.other++
			if s.firstOther == "" {
				s.firstOther = strconv.Itoa(a.code) + " " + a.body
			}
		}
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		s.p50, s.p99, s.max = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)], lat[len(lat)-1]
	}
	return s
}

func (s summary) String() string {
	return fmt.Sprintf("%d requests: %d ok (p50 %s, p99 %s, max %s), %d 429, %d other, %d errors",
		s.total, s.ok, s.p50.Round(time.Millisecond), s.p99.Round(time.Millisecond), s.max.Round(time.Millisecond), s.tooMany, s.other, s.errs)
}

// tooMany returns the 429s of the record.
func (r *record) tooMany() []answer {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []answer
	for _, a := range r.answers {
		if a.code == http.StatusTooManyRequests {
			out = append(out, a)
		}
	}
	return out
}

// loop runs fn in n goroutines until ctx ends, each waiting pause after
// every call.
func loop(ctx context.Context, wg *sync.WaitGroup, n int, pause time.Duration, fn func(ctx context.Context, worker int)) {
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				fn(ctx, w)
				if pause > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(pause):
					}
				}
			}
		}()
	}
}
