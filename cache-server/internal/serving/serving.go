// Package serving runs a role's HTTPS API behind the delegated
// authentication and authorization of package auth, and its plain-HTTP
// probe and metrics port. Shared by the standalone, shard and front roles.
package serving

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes"

	"github.com/cachetier/cachetier/cache-server/internal/auth"
	"github.com/cachetier/cachetier/cache-server/internal/http2server"
	"github.com/cachetier/cachetier/cache-server/internal/memlimit"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/internal/aggpath"
)

// Config is one HTTPS API.
type Config struct {
	Listener    net.Listener
	Certificate tls.Certificate
	// GetCertificate, when set, is used instead of Certificate (files
	// re-read on rotation, servingcert.Files).
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Client is the apiserver that authenticates and authorizes callers.
	Client kubernetes.Interface
	// Paths are the profile's aggregated paths, stripped before
	// authorization (auth.Options).
	Paths aggpath.Paths
	// API serves everything but /metrics and /debug/pprof.
	API http.Handler
	// Registry is served at /metrics (authorized like any non-resource URL).
	Registry *prometheus.Registry
	Metrics  *metrics.Metrics
	// Profiling serves net/http/pprof under /debug/pprof/ (authorized:
	// kube-apiserver's own rule for its profiles).
	Profiling bool
	Log       logr.Logger
	// BeforeShutdown ends long-running streams (watches), which
	// http.Server.Shutdown waits for but never interrupts.
	BeforeShutdown func()
	// GoawayChance is the fraction of HTTP/2 requests after which the
	// client is asked to reconnect (withGoaway); 0 never.
	GoawayChance float64
	// PriorityAndFairness, when set, is the priority-and-fairness filter
	// (auth.Options.PriorityAndFairness).
	PriorityAndFairness func(http.Handler) http.Handler
	// RequestTimeout, when set, bounds every request but a watch (package
	// deadline; deadline.RequestTimeout where clients are served). A
	// shard sets none: its clients are fronts, whose requests have
	// deadlines of their own and cancel the shard's work when cut, and its
	// change stream to a front (/shard/v1/watch, not a "watch" verb to
	// the request-info parser) must not be cut.
	RequestTimeout time.Duration
	// Gatherer, when set, is served at /metrics next to Registry (the
	// library metrics of priority and fairness, apf.Gatherer).
	Gatherer prometheus.Gatherer
}

// Gatherer is reg plus extra (when set): what /metrics serves.
func Gatherer(reg *prometheus.Registry, extra prometheus.Gatherer) prometheus.Gatherer {
	if extra == nil {
		return reg
	}
	return prometheus.Gatherers{reg, extra}
}

// timedOut counts and logs a request cut at its deadline: a client that
// reads too slowly (or a read that took a minute, which the apiserver
// would cut too).
func timedOut(cfg Config) func(r *http.Request) {
	return func(r *http.Request) {
		verb, name := "", ""
		if info, ok := request.RequestInfoFrom(r.Context()); ok {
			verb = info.Verb
		}
		if u, ok := request.UserFrom(r.Context()); ok {
			name = u.GetName()
		}
		cfg.Metrics.RequestDeadlineExceeded.WithLabelValues(verb).Inc()
		cfg.Log.Info("request cut at its deadline", "user", name, "verb", verb, "path", r.URL.Path, "deadline", cfg.RequestTimeout)
	}
}

// Run serves until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(Gatherer(cfg.Registry, cfg.Gatherer), promhttp.HandlerOpts{}))
	mux.Handle("/", cfg.API)
	if cfg.Profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	handler, clientAuth, err := auth.Wrap(ctx, auth.Options{
		Client: cfg.Client, Paths: cfg.Paths, AlwaysAllowPaths: []string{"/healthz", "/livez", "/readyz"},
		ConnCacheResults: cfg.Metrics.AuthnConnCache, LastKnownAnswers: cfg.Metrics.AuthLastKnown, AuthorizationRenewals: cfg.Metrics.AuthzRenewals, ImpersonationResults: cfg.Metrics.Impersonation, SelectorAuthorizations: cfg.Metrics.SelectorAuthorizations, Log: cfg.Log,
		PriorityAndFairness: cfg.PriorityAndFairness,
		RequestTimeout:      cfg.RequestTimeout, TimedOut: timedOut(cfg),
	}, mux)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           withGoaway(handler, cfg.GoawayChance, cfg.Metrics.Goaways),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{ClientAuth: clientAuth, MinVersion: tls.VersionTLS12},
		// Per-connection authentication cache (auth.Wrap's authenticator).
		ConnContext: auth.ConnContext,
	}
	if cfg.GetCertificate != nil {
		srv.TLSConfig.GetCertificate = cfg.GetCertificate
	} else {
		srv.TLSConfig.Certificates = []tls.Certificate{cfg.Certificate}
	}
	if err := http2server.Configure(srv); err != nil {
		return err
	}
	go reportSelf(ctx, cfg)
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(cfg.Listener, "", "") }()
	cfg.Log.Info("serving", "address", cfg.Listener.Addr().String(), "prefix", cfg.Paths.Prefix, "root", cfg.Paths.Root)
	select {
	case <-ctx.Done():
		if cfg.BeforeShutdown != nil {
			cfg.BeforeShutdown()
		}
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// StartProbes runs probes on ln in the background until ctx ends or the
// returned stop is called; stop returns once the port is closed, so a role
// that defers it does not return with its probe port still bound (a
// replica restarted in the same process binds it again).
func StartProbes(ctx context.Context, ln net.Listener, reg prometheus.Gatherer, ready func() error) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		probes(ctx, ln, reg, ready)
	}()
	return func() {
		cancel()
		<-done
	}
}

// probes serves /metrics, /readyz and /livez over plain HTTP on ln (the
// fleet's probe and scrape port) until ctx ends. ready returns nil when
// the role can serve.
func probes(ctx context.Context, ln net.Listener, reg prometheus.Gatherer, ready func() error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	_ = srv.Serve(ln)
}

// Registry is reg, or a new registry with Go's runtime and process
// collectors when reg is nil.
func Registry(reg *prometheus.Registry) *prometheus.Registry {
	if reg != nil {
		return reg
	}
	reg = prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// reportSelf exports what alerts need about the process: its cgroup memory
// limit (read once: a container's limit does not change without a
// restart) and, every minute, the expiry of the certificate it presents
// (which changes when the mounted Secret is rotated).
func reportSelf(ctx context.Context, cfg Config) {
	if limit, ok, err := memlimit.Read("/sys/fs/cgroup"); err != nil {
		cfg.Log.Error(err, "reading the cgroup memory limit; cachetier_memory_limit_bytes is not exported")
	} else if ok {
		cfg.Metrics.MemoryLimit.WithLabelValues().Set(float64(limit))
	}
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		if notAfter, err := servingNotAfter(cfg); err != nil {
			cfg.Log.Error(err, "reading the serving certificate's expiry")
		} else {
			cfg.Metrics.ServingCertExpiry.Set(float64(notAfter.Unix()))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// servingNotAfter is the expiry of the certificate a new connection gets.
func servingNotAfter(cfg Config) (time.Time, error) {
	cert := &cfg.Certificate
	if cfg.GetCertificate != nil {
		c, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			return time.Time{}, err
		}
		cert = c
	}
	if cert == nil || len(cert.Certificate) == 0 {
		return time.Time{}, errors.New("no serving certificate")
	}
	if cert.Leaf != nil {
		return cert.Leaf.NotAfter, nil
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return time.Time{}, err
	}
	return leaf.NotAfter, nil
}
