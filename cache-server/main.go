// Command cache-server is cachetier's data plane. Roles:
//
//	cache-server standalone --profile profile.yaml --kubeconfig kubeconfig
//
// runs the front and every hash shard in one process (shard and front roles
// for a distributed fleet come later).
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cachetier/cachetier/cache-server/internal/encoding"
	"github.com/cachetier/cachetier/cache-server/internal/servingcert"
	"github.com/cachetier/cachetier/cache-server/internal/standalone"
)

// defaultGCPercent is the tier's GC target unless GOGC is set. Its live
// heap is almost all cached objects, held as pointer-free byte slices the
// collector does not scan, and its request paths allocate little; so a
// lower target than Go's 100 (the heap may grow to twice the live data
// before a collection) costs little CPU and keeps resident memory near the
// data. Measured (docs/benchmarks.md): 64 JSON watch-list informers of 200
// x 500 KiB Secrets, peak RSS 317 -> 252 MiB for +10% CPU; consistent and
// paginated LIST CPU and latency unchanged.
const defaultGCPercent = 25

func main() {
	if len(os.Args) < 2 || os.Args[1] != "standalone" {
		fmt.Fprintln(os.Stderr, "usage: cache-server standalone --profile FILE [--kubeconfig FILE] [--listen ADDR] [--tls-cert-file F --tls-private-key-file F]")
		os.Exit(2)
	}
	if err := runStandalone(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "cache-server:", err)
		os.Exit(1)
	}
}

func runStandalone(args []string) error {
	fs := flag.NewFlagSet("standalone", flag.ExitOnError)
	profilePath := fs.String("profile", "", "CacheProfile manifest (YAML) naming the resources to cache")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the apiserver to cache (default: in-cluster)")
	listen := fs.String("listen", "127.0.0.1:8443", "HTTPS address to serve on")
	certFile := fs.String("tls-cert-file", "", "serving certificate (default: a self-signed one written to --cert-dir)")
	keyFile := fs.String("tls-private-key-file", "", "serving key")
	certDir := fs.String("cert-dir", "", "where a generated self-signed certificate and its CA are written")
	hosts := fs.String("tls-hosts", "localhost,127.0.0.1", "comma-separated DNS names/IPs for a generated certificate")
	verbosity := fs.Int("v", 0, "log verbosity")
	protobufCache := fs.Int64("protobuf-cache-bytes", encoding.DefaultCacheBytes, "memory for protobuf encodings of cached objects, kept for protobuf clients (client-go's typed informers); a miss converts the stored JSON again; 0 = the default")
	profiling := fs.Bool("profiling", true, "serve Go's profiles under /debug/pprof/ (authorized like any non-resource path, as kube-apiserver's --profiling)")
	_ = fs.Parse(args)
	if *profilePath == "" {
		return fmt.Errorf("--profile is required")
	}
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: *verbosity})

	profile, err := standalone.LoadProfile(*profilePath)
	if err != nil {
		return err
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *kubeconfig
	upstream, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	var cert tls.Certificate
	if *certFile != "" {
		if cert, err = tls.LoadX509KeyPair(*certFile, *keyFile); err != nil {
			return err
		}
	} else {
		if cert, err = servingcert.SelfSigned(*certDir, *hosts); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return standalone.Run(ctx, standalone.Config{
		ProfileName: profile.Name, Spec: profile.Spec, Upstream: upstream,
		Listener: ln, Certificate: cert, Log: logr.Logger(log), Profiling: *profiling,
		ProtobufCacheBytes: *protobufCache,
	})
}
