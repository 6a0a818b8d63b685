// Command manager runs the cachetier operator: it reconciles CacheProfiles
// into cache-server fleets.
package main

import (
	"cmp"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/cachetier/cachetier/controllers"
)

func main() {
	var (
		metricsAddr, probeAddr, namespace, image, apiServerURL string
		leaderElect, secureMetrics                             bool
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8443", "Address of the metrics endpoint (\"0\" disables it).")
	flag.BoolVar(&secureMetrics, "metrics-secure", true, "Serve metrics over HTTPS with authentication and authorization by the apiserver.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints.")
	flag.BoolVar(&leaderElect, "leader-elect", true, "Elect a leader so that only one replica reconciles.")
	flag.StringVar(&namespace, "workload-namespace", os.Getenv("POD_NAMESPACE"), "Namespace of the cache-server fleets (default: the operator's namespace from POD_NAMESPACE).")
	flag.StringVar(&image, "cache-server-image", os.Getenv("RELATED_IMAGE_CACHE_SERVER"), "cache-server image used when a profile sets none (default: RELATED_IMAGE_CACHE_SERVER, else the manager's own image, read from its pod named by POD_NAME).")
	flag.StringVar(&apiServerURL, "apiserver-url", "", "Apiserver URL clients use, for status.serverURL (default: the URL the operator talks to).")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	if err := run(metricsAddr, secureMetrics, probeAddr, leaderElect, namespace, image, apiServerURL); err != nil {
		ctrl.Log.Error(err, "manager failed")
		os.Exit(1)
	}
}

func run(metricsAddr string, secureMetrics bool, probeAddr string, leaderElect bool, namespace, image, apiServerURL string) error {
	if namespace == "" {
		return fmt.Errorf("--workload-namespace or POD_NAMESPACE must be set")
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := controllers.AddToScheme(scheme); err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	if apiServerURL == "" {
		apiServerURL = cfg.Host
	}
	ctx := ctrl.SetupSignalHandler()
	// The manager's own pod is in POD_NAMESPACE, which --workload-namespace
	// may differ from.
	podNamespace := cmp.Or(os.Getenv("POD_NAMESPACE"), namespace)
	if image, err = cacheServerImage(ctx, cfg, image, podNamespace, podNameFromEnv()); err != nil {
		return err
	}
	ctrl.Log.Info("fleets run this cache-server image unless a profile sets spec.image", "image", image)
	metricsOpts := metricsserver.Options{BindAddress: metricsAddr, SecureServing: secureMetrics}
	if secureMetrics {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  controllers.CacheOptions(namespace),
		Metrics:                metricsOpts,
		HealthProbeBindAddress: probeAddr,
		LeaderElection:         leaderElect,
		LeaderElectionID:       "cachetier-operator.cachetier.io",
		// A leader that stops (a drain, a rollout) hands the lease over
		// instead of leaving the other replica to wait for it to expire:
		// the process exits right after, so nothing reconciles twice.
		LeaderElectionReleaseOnCancel: true,
		// The lease lives with the operator, not in the default namespace.
		LeaderElectionNamespace: namespace,
	})
	if err != nil {
		return err
	}
	r := &controllers.CacheProfileReconciler{
		Client:   mgr.GetClient(),
		Scheme:   scheme,
		Recorder: mgr.GetEventRecorder("cachetier-operator"),
		Options:  controllers.Options{Namespace: namespace, DefaultImage: image, APIServerURL: apiServerURL},
		// Served on the manager's metrics endpoint with controller-runtime's.
		Metrics: controllers.NewProfileMetrics(ctrlmetrics.Registry, mgr.GetCache()),
		Now:     time.Now,
		Rand:    rand.Reader,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	return mgr.Start(ctx)
}
