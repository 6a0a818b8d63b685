// Command cache-server is cachetier's data plane. Roles:
//
//	cache-server standalone --profile profile.yaml [--kubeconfig kubeconfig]
//	cache-server shard --profile profile.yaml --hash-shards FIRST-LAST ...
//	cache-server front --profile profile.yaml --topology topology.yaml ...
//
// standalone runs the front and every hash shard in one process; shard and
// front are a fleet's two kinds of pods (docs/operator.md has the contract
// with the operator that runs them).
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
	"strconv"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cachetier/cachetier/api/topology"
	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/encoding"
	"github.com/cachetier/cachetier/cache-server/internal/fleet"
	"github.com/cachetier/cachetier/cache-server/internal/frontrole"
	"github.com/cachetier/cachetier/cache-server/internal/gomaxprocs"
	"github.com/cachetier/cachetier/cache-server/internal/gzipchunks"
	"github.com/cachetier/cachetier/cache-server/internal/serving"
	"github.com/cachetier/cachetier/cache-server/internal/servingcert"
	"github.com/cachetier/cachetier/cache-server/internal/shardrole"
	"github.com/cachetier/cachetier/cache-server/internal/standalone"
	"github.com/cachetier/cachetier/internal/aggpath"
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

// defaultFrontGoawayChance: one request in a hundred moves the
// aggregator's connection (serving.withGoaway). A reconnect costs a TLS
// handshake; a 2-front fleet whose second front never serves costs a
// whole front.
const defaultFrontGoawayChance = 0.01

const usage = `usage:
  cache-server standalone --profile FILE [--kubeconfig FILE] [--listen ADDR] [--tls-cert-file F --tls-private-key-file F]
  cache-server shard --profile FILE --hash-shards FIRST-LAST --tls-cert-file F --tls-private-key-file F [--listen ADDR] [--metrics-listen ADDR]
  cache-server front --profile FILE --topology FILE --shard-ca-file F --tls-cert-file F --tls-private-key-file F [--shard-addresses-from NAMESPACE/SERVICE] [--listen ADDR] [--metrics-listen ADDR]`

func main() {
	roles := map[string]func([]string) error{"standalone": runStandalone, "shard": runShard, "front": runFront}
	if len(os.Args) < 2 || roles[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	if err := roles[os.Args[1]](os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "cache-server:", err)
		os.Exit(1)
	}
}

// common are the flags every role has.
type common struct {
	fs                        *flag.FlagSet
	profilePath, kubeconfig   *string
	listen, certFile, keyFile *string
	metricsListen             *string
	verbosity                 *int
	profiling                 *bool
	priorityAndFairness       *bool
	profile                   *v1alpha1.CacheProfile
	upstream                  *rest.Config
	log                       logr.Logger
	getCertificate            func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	listener, metricsListener net.Listener
}

func newCommon(role, defaultListen string) *common {
	fs := flag.NewFlagSet(role, flag.ExitOnError)
	return &common{
		fs:                  fs,
		profilePath:         fs.String("profile", "", "CacheProfile manifest (YAML) naming the resources to cache"),
		kubeconfig:          fs.String("kubeconfig", "", "kubeconfig of the apiserver to cache (default: in-cluster)"),
		listen:              fs.String("listen", defaultListen, "HTTPS address to serve on"),
		certFile:            fs.String("tls-cert-file", "", "serving certificate (re-read when it changes)"),
		keyFile:             fs.String("tls-private-key-file", "", "serving key"),
		metricsListen:       fs.String("metrics-listen", "", "plain-HTTP address for /metrics, /readyz and /livez (probes, scraping); empty: none"),
		verbosity:           fs.Int("v", 0, "log verbosity"),
		profiling:           fs.Bool("profiling", true, "serve Go's profiles under /debug/pprof/ (authorized like any non-resource path, as kube-apiserver's --profiling)"),
		priorityAndFairness: fs.Bool("enable-priority-and-fairness", true, "queue, dispatch and reject requests by the cluster's FlowSchemas and PriorityLevelConfigurations, as kube-apiserver's flag of the same name (standalone and front; a shard serves only fronts); false only to measure without it"),
	}
}

// setUp parses the flags and loads what every role needs. requireCert:
// the role has no self-signed fallback.
func (c *common) setUp(args []string, requireCert bool) error {
	_ = c.fs.Parse(args)
	if *c.profilePath == "" {
		return fmt.Errorf("--profile is required")
	}
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	c.log = logr.Logger(funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: *c.verbosity}))
	cpus, procs, raised := gomaxprocs.Raise(os.LookupEnv)
	c.log.Info("Go Ps", "cpus", cpus, "gomaxprocs", procs, "fromEnvironment", !raised)
	var err error
	if c.profile, err = standalone.LoadProfile(*c.profilePath); err != nil {
		return err
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *c.kubeconfig
	if c.upstream, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig(); err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	if *c.certFile != "" {
		files, err := servingcert.LoadFiles(*c.certFile, *c.keyFile)
		if err != nil {
			return err
		}
		c.getCertificate = files.GetCertificate
	} else if requireCert {
		return fmt.Errorf("--tls-cert-file and --tls-private-key-file are required")
	}
	if c.listener, err = net.Listen("tcp", *c.listen); err != nil {
		return err
	}
	if *c.metricsListen != "" {
		if c.metricsListener, err = net.Listen("tcp", *c.metricsListen); err != nil {
			return err
		}
	}
	return nil
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// defaultBulkRequestNice weighs a bulk request's thread at a tenth of a
// normal one's (the kernel's weights: 1024 at nice 0, 110 at nice 10):
// under a flood of full LISTs a node's indexed LIST gets a core first,
// while a lowered thread that holds a Go P or delays a collection is
// still run soon (docs/priority-and-fairness.md).
const defaultBulkRequestNice = 10

const bulkRequestNiceUsage = "nice value (1-19) of the OS threads that run a large request's work — a LIST of 1,000 objects or 1 MiB and more, a large watch-list's initial events — so that when the cores are contended the kernel runs short requests (a kubelet's LIST of its node's Pods, a GET) first; decided by priority and fairness's work estimate (a shard's threads are not lowered: measured, a lowered shard thread holding one of Go's Ps made the front's short requests wait longer); 0: every request at the process's own priority"

// checkBulkNice refuses a --bulk-request-nice outside 0-19: a negative
// value would raise bulk work above short requests (and needs
// CAP_SYS_NICE).
func checkBulkNice(n int) error {
	if n < 0 || n > 19 {
		return fmt.Errorf("--bulk-request-nice %d: want 0 (off) to 19", n)
	}
	return nil
}

// listGzipCacheUsage is --list-gzip-cache-bytes' help, the same for a
// standalone tier and a fleet's front (which know their items by Seq and
// by content).
const listGzipCacheUsage = "memory for compressed chunks of gzipped JSON LISTs and watch-lists' initial events, kept so a LIST or watch-list of objects that did not change since an earlier one is not compressed again; chunks that compress to more than half their size are not kept; 0 = the default, negative = none kept"

func runStandalone(args []string) error {
	c := newCommon("standalone", "127.0.0.1:8443")
	certDir := c.fs.String("cert-dir", "", "where a generated self-signed certificate and its CA are written")
	hosts := c.fs.String("tls-hosts", "localhost,127.0.0.1", "comma-separated DNS names/IPs for a generated certificate")
	bulkNice := c.fs.Int("bulk-request-nice", defaultBulkRequestNice, bulkRequestNiceUsage)
	protobufCache := c.fs.Int64("protobuf-cache-bytes", encoding.DefaultCacheBytes, "memory for protobuf encodings of cached objects, kept for protobuf clients (client-go's typed informers); a miss converts the stored JSON again; messages of 64 KiB and more are never kept (streamed from the JSON); 0 = the default")
	listGzipCache := c.fs.Int64("list-gzip-cache-bytes", gzipchunks.DefaultCacheBytes, listGzipCacheUsage)
	for _, a := range args {
		if strings.HasPrefix(strings.TrimLeft(a, "-"), "metrics-listen") {
			return fmt.Errorf("--metrics-listen is for the shard and front roles; standalone serves /metrics and its probes on its API port")
		}
	}
	if err := c.setUp(args, false); err != nil {
		return err
	}
	if err := checkBulkNice(*bulkNice); err != nil {
		return err
	}
	var cert tls.Certificate
	if c.getCertificate == nil {
		var err error
		if cert, err = servingcert.SelfSigned(*certDir, *hosts); err != nil {
			return err
		}
	}
	ctx, stop := signalContext()
	defer stop()
	return standalone.Run(ctx, standalone.Config{
		ProfileName: c.profile.Name, Spec: c.profile.Spec, Upstream: c.upstream,
		Listener: c.listener, Certificate: cert, GetCertificate: c.getCertificate, Log: c.log, Profiling: *c.profiling,
		ProtobufCacheBytes: *protobufCache, ListGzipCacheBytes: *listGzipCache,
		DisablePriorityAndFairness: !*c.priorityAndFairness, BulkRequestNice: *bulkNice,
	})
}

func runShard(args []string) error {
	c := newCommon("shard", "0.0.0.0:8444")
	name := c.fs.String("shard-name", "", "this shard's name (logs)")
	hashShards := c.fs.String("hash-shards", "", "the hash shards this shard keeps: FIRST-LAST (inclusive) of the profile's hashShards")
	if err := c.setUp(args, true); err != nil {
		return err
	}
	first, last, err := parseRange(*hashShards)
	if err != nil {
		return fmt.Errorf("--hash-shards: %w", err)
	}
	ctx, stop := signalContext()
	defer stop()
	return shardrole.Run(ctx, shardrole.Config{
		Name: *name, Spec: c.profile.Spec, First: first, Last: last, Upstream: c.upstream,
		Listener: c.listener, GetCertificate: c.getCertificate, ProbeListener: c.metricsListener,
		Profiling: *c.profiling, Log: c.log.WithValues("shard", *name),
	})
}

func runFront(args []string) error {
	c := newCommon("front", "0.0.0.0:8443")
	topoPath := c.fs.String("topology", "", "the fleet's topology (YAML): hash shard ranges and shard endpoints")
	shardCA := c.fs.String("shard-ca-file", "", "CA that signed the shards' serving certificates")
	goawayChance := c.fs.Float64("goaway-chance", defaultFrontGoawayChance, "fraction of HTTP/2 requests after which the client (the apiserver's aggregator) is sent GOAWAY and reconnects, landing on a front the Service picks; as kube-apiserver's --goaway-chance, at most 0.02; 0 = never")
	apiGroup := c.fs.String("api-group", "", "the profile's aggregated API group (<profile>.cache.cachetier.io); checked against the profile")
	bulkNice := c.fs.Int("bulk-request-nice", defaultBulkRequestNice, bulkRequestNiceUsage)
	protobufCache := c.fs.Int64("protobuf-cache-bytes", encoding.DefaultCacheBytes, "memory for protobuf encodings of objects, kept for protobuf clients; messages of 64 KiB and more are never kept (streamed from the JSON); 0 = the default")
	listGzipCache := c.fs.Int64("list-gzip-cache-bytes", gzipchunks.DefaultCacheBytes, listGzipCacheUsage)
	addressesFrom := c.fs.String("shard-addresses-from", "", "NAMESPACE/SERVICE: the shards' headless Service, whose EndpointSlices (watched on the apiserver) give the current address of each replica the topology names <pod>.SERVICE.NAMESPACE.svc, instead of cluster DNS, whose cache lags a replaced pod by its TTL; other names are looked up in DNS")
	if err := c.setUp(args, true); err != nil {
		return err
	}
	if err := checkBulkNice(*bulkNice); err != nil {
		return err
	}
	var addrNamespace, addrService string
	if *addressesFrom != "" {
		var ok bool
		if addrNamespace, addrService, ok = strings.Cut(*addressesFrom, "/"); !ok || addrNamespace == "" || addrService == "" {
			return fmt.Errorf("--shard-addresses-from %q is not NAMESPACE/SERVICE", *addressesFrom)
		}
	}
	if *topoPath == "" || *shardCA == "" {
		return fmt.Errorf("--topology and --shard-ca-file are required")
	}
	if err := serving.ValidateGoawayChance(*goawayChance); err != nil {
		return err
	}
	if want := aggpath.For(c.profile.Name).Group; *apiGroup != "" && *apiGroup != want {
		return fmt.Errorf("--api-group %s does not match profile %s (%s)", *apiGroup, c.profile.Name, want)
	}
	topo, err := topology.Load(*topoPath)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	var resolve func(string) (string, bool)
	if addrService != "" {
		kc, err := kubernetes.NewForConfig(c.upstream)
		if err != nil {
			return err
		}
		resolve = fleet.WatchReplicaAddresses(ctx, kc, addrNamespace, addrService, c.log.WithValues("role", "front")).Lookup
	}
	// Shards authorize the front like any caller: it presents the
	// credentials it uses for the apiserver (in a pod, its ServiceAccount
	// token), over TLS verified against the shards' CA bundle.
	shardClient, err := fleet.NewHTTPClient(c.upstream, *shardCA, resolve)
	if err != nil {
		return fmt.Errorf("shard client: %w", err)
	}
	return frontrole.Run(ctx, frontrole.Config{
		ProfileName: c.profile.Name, Spec: c.profile.Spec, Topology: topo, Upstream: c.upstream,
		ShardClient: shardClient, Listener: c.listener, GetCertificate: c.getCertificate,
		ProbeListener: c.metricsListener, Profiling: *c.profiling, ProtobufCacheBytes: *protobufCache,
		ListGzipCacheBytes: *listGzipCache, GoawayChance: *goawayChance, Log: c.log.WithValues("role", "front"),
		DisablePriorityAndFairness: !*c.priorityAndFairness, BulkRequestNice: *bulkNice,
	})
}

// parseRange parses FIRST-LAST.
func parseRange(s string) (int, int, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("want FIRST-LAST, got %q", s)
	}
	first, err1 := strconv.Atoi(a)
	last, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || first < 0 || last < first {
		return 0, 0, fmt.Errorf("want FIRST-LAST with 0 <= FIRST <= LAST, got %q", s)
	}
	return first, last, nil
}
