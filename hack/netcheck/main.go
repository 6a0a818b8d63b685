// Command netcheck is the probe pod of hack/cluster's tests: from inside a
// pod it checks what every in-cluster client depends on — the pod's DNS
// (resolv.conf written by the kubelet, answered by CoreDNS), the
// apiserver's Service through kube-proxy, the ServiceAccount token the
// kubelet mounted — and serves HTTP so that a Service can route to it.
//
//	netcheck serve             readiness (/readyz) turns 200 once every check passed
//	netcheck resolve NAME      prints NAME's addresses (for kubectl exec)
//	netcheck get URL           GETs URL (for kubectl exec; pod-to-Service)
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

const (
	saDir = "/var/run/secrets/kubernetes.io/serviceaccount"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: netcheck serve | resolve NAME | get URL")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve()
	case "resolve":
		var addrs []string
		addrs, err = net.DefaultResolver.LookupHost(context.Background(), arg(2))
		if err == nil {
			fmt.Println(strings.Join(addrs, " "))
		}
	case "get":
		var body string
		body, err = get(arg(2))
		if err == nil {
			fmt.Print(body)
		}
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "netcheck:", err)
		os.Exit(1)
	}
}

func arg(i int) string {
	if len(os.Args) <= i {
		fmt.Fprintln(os.Stderr, "netcheck: missing argument")
		os.Exit(2)
	}
	return os.Args[i]
}

func get(url string) (string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b), err
}

// checkAPIServer reaches the apiserver the way client-go's in-cluster
// config does: the KUBERNETES_SERVICE_HOST ClusterIP, the mounted CA and
// token, and asks who it is.
func checkAPIServer() error {
	ca, err := os.ReadFile(saDir + "/ca.crt")
	if err != nil {
		return err
	}
	token, err := os.ReadFile(saDir + "/token")
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("no certificate in %s/ca.crt", saDir)
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	host := net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"))
	req, _ := http.NewRequest(http.MethodPost, "https://"+host+"/apis/authentication.k8s.io/v1/selfsubjectreviews",
		strings.NewReader(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`))
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("SelfSubjectReview: %s: %s", resp.Status, b)
	}
	fmt.Printf("apiserver at %s says: %s\n", host, b)
	return nil
}

func serve() error {
	var ready atomic.Bool
	go func() {
		for {
			addrs, err := net.DefaultResolver.LookupHost(context.Background(), "kubernetes.default.svc.cluster.local")
			if err == nil {
				fmt.Printf("kubernetes.default.svc.cluster.local resolves to %v\n", addrs)
				err = checkAPIServer()
			}
			if err == nil {
				ready.Store(true)
				return
			}
			fmt.Println("not ready:", err)
			time.Sleep(time.Second)
		}
	}()
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "checks pending", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		name, _ := os.Hostname()
		fmt.Fprintf(w, "hello from %s\n", name)
	})
	return http.ListenAndServe(":8080", mux)
}
