// Command localcluster is `make run`: it starts a real etcd and kube-apiserver
// on loopback (see hack/controlplane), prints how to reach them, and tears
// everything down on Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/cachetier/cachetier/hack/controlplane"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

func run() error {
	port := flag.Int("port", 6443, "apiserver secure port on 127.0.0.1 (0 picks a free one; 6443 falls back to a free port when taken)")
	dir := flag.String("dir", "", "working directory (default: a temporary directory, removed on exit)")
	flag.Parse()

	if *port == 6443 && !portFree(*port) {
		*port = 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cp, err := controlplane.Start(ctx, controlplane.Options{
		Dir:                   *dir,
		SecurePort:            *port,
		ServiceClusterIPRange: controlplane.DefaultServiceClusterIPRange,
		Log:                   os.Stdout,
	})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("stopping control plane")
		if err := cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop:", err)
		}
	}()

	kubeconfig := cp.AdminKubeconfig
	if root, err := controlplane.RepoRoot(); err == nil {
		// A stable path so the printed commands survive copy and paste
		// across runs.
		stable := filepath.Join(root, "bin", "run", "kubeconfig")
		if err := os.MkdirAll(filepath.Dir(stable), 0o755); err == nil {
			if data, err := os.ReadFile(cp.AdminKubeconfig); err == nil && os.WriteFile(stable, data, 0o600) == nil {
				kubeconfig = stable
			}
		}
	}
	fmt.Printf(`
cachetier local control plane is up.
  apiserver:   %s (service range %s)
  kubeconfig:  %s
  logs:        %s/*.log

Try:
  %s --kubeconfig %s version
  %s --kubeconfig %s get ns

Press Ctrl-C to stop; everything is torn down.
`, cp.URL, cp.ServiceClusterIPRange, kubeconfig, cp.Dir,
		cp.Kubectl(), kubeconfig, cp.Kubectl(), kubeconfig)
	<-ctx.Done()
	return nil
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
