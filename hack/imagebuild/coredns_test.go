package imagebuild

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/freeport"
)

// TestCorefile runs the CoreDNS that hack/coredns-build builds with the
// Corefile the node uses, against a real kube-apiserver, and asks it what
// pods ask: Service and Pod names, reverse lookups, and names outside the
// cluster (which it must refuse with NXDOMAIN, having no upstream).
//
// The only edits to the Corefile are those a test process needs in place
// of a pod: a kubeconfig instead of the in-cluster service account, and
// free loopback ports instead of the pod's own 8080/8181/9153.
func TestCorefile(t *testing.T) {
	root := repoRoot(t)
	bin := filepath.Join(t.TempDir(), "coredns")
	if err := goBuild(t.Context(), filepath.Join(root, "hack", "coredns-build"), bin, ".", goFlags{}); err != nil {
		t.Fatal(err)
	}
	cp := controlplane.StartForTest(t, controlplane.Options{})
	cfg, err := cp.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	svc, err := client.CoreV1().Services("default").Create(t.Context(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The apiserver's bootstrap controller creates default/kubernetes a
	// moment after /readyz turns ok; on a loaded machine the test can ask
	// first (CI saw "not found"), so wait for it as a pod would.
	var apiSvc *corev1.Service
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		s, err := client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		apiSvc = s
		return err == nil, err
	}); err != nil {
		t.Fatalf("service default/kubernetes: %v", err)
	}

	dnsPort, healthPort, readyPort, metricsPort := freePort(t), freePort(t), freePort(t), freePort(t)
	corefile := Corefile
	for _, edit := range [][2]string{
		{"        pods insecure\n", "        kubeconfig " + cp.AdminKubeconfig + "\n        pods insecure\n"},
		{"health :8080", "health 127.0.0.1:" + healthPort},
		{"ready :8181", "ready 127.0.0.1:" + readyPort},
		{"prometheus :9153", "prometheus 127.0.0.1:" + metricsPort},
	} {
		if strings.Count(corefile, edit[0]) != 1 {
			t.Fatalf("the Corefile no longer has exactly one %q; update this test", edit[0])
		}
		corefile = strings.Replace(corefile, edit[0], edit[1], 1)
	}
	conf := filepath.Join(t.TempDir(), "Corefile")
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	exited, logPath, err := cp.StartProcess("coredns", bin, "-conf", conf, "-dns.port", dnsPort)
	if err != nil {
		t.Fatal(err)
	}
	waitHTTP(t, "http://127.0.0.1:"+readyPort+"/ready", exited, logPath)
	waitHTTP(t, "http://127.0.0.1:"+healthPort+"/health", exited, logPath)

	dns := "127.0.0.1:" + dnsPort
	waitDNS(t, dns, exited, logPath)
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	for _, c := range []struct {
		name   string
		typ    dnsmessage.Type
		rcode  dnsmessage.RCode
		answer string // A address or PTR target; "" for none
	}{
		{"web.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, svc.Spec.ClusterIP},
		{"kubernetes.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, apiSvc.Spec.ClusterIP},
		{"100-64-1-7.default.pod.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, "100.64.1.7"},
		{reverseName(ip(svc.Spec.ClusterIP)), dnsmessage.TypePTR, dnsmessage.RCodeSuccess, "web.default.svc.cluster.local."},
		{"missing.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, ""},
		{reverseName(ip("100.127.0.1")), dnsmessage.TypePTR, dnsmessage.RCodeNameError, ""},
		// Outside the cluster: NXDOMAIN at once, never a query upstream.
		{"example.com.", dnsmessage.TypeA, dnsmessage.RCodeNameError, ""},
		{"web.default.svc.cluster.local.example.com.", dnsmessage.TypeAAAA, dnsmessage.RCodeNameError, ""},
	} {
		rcode, answers := query(t, dns, c.name, c.typ)
		var got []string
		for _, a := range answers {
			switch b := a.Body.(type) {
			case *dnsmessage.AResource:
				got = append(got, netip.AddrFrom4(b.A).String())
			case *dnsmessage.PTRResource:
				got = append(got, b.PTR.String())
			}
			if a.Header.TTL != 30 {
				t.Errorf("%s %v: TTL %d, the Corefile says 30", c.name, c.typ, a.Header.TTL)
			}
		}
		want := []string(nil)
		if c.answer != "" {
			want = []string{c.answer}
		}
		if rcode != c.rcode || !slices.Equal(got, want) {
			t.Errorf("%s %v: %v %q, want %v %q", c.name, c.typ, rcode, got, c.rcode, want)
		}
	}

	resp, err := http.Get("http://127.0.0.1:" + metricsPort + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "coredns_dns_requests_total") {
		t.Errorf("/metrics has no coredns_dns_requests_total")
	}
}

// query sends one DNS question over UDP and returns the rcode and answers.
func query(t *testing.T, server, name string, typ dnsmessage.Type) (dnsmessage.RCode, []dnsmessage.Resource) {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: uint16(rand.IntN(1 << 16)), RecursionDesired: true})
	if err := b.StartQuestions(); err != nil {
		t.Fatal(err)
	}
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	msg, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("udp", server)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("%s %v: %v", name, typ, err)
	}
	var p dnsmessage.Parser
	h, err := p.Start(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SkipAllQuestions(); err != nil {
		t.Fatal(err)
	}
	answers, err := p.AllAnswers()
	if err != nil {
		t.Fatal(err)
	}
	return h.RCode, answers
}

// reverseName is the in-addr.arpa name of an IPv4 address.
func reverseName(a netip.Addr) string {
	b := a.As4()
	return fmt.Sprintf("%d.%d.%d.%d.in-addr.arpa.", b[3], b[2], b[1], b[0])
}

// waitHTTP waits up to a minute for url to answer 200, failing early with
// the process's log if it exits.
func waitHTTP(t *testing.T, url string, exited <-chan struct{}, logPath string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-exited:
			t.Fatalf("coredns exited; its log:\n%s", controlplane.LogTail(logPath, 40))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not OK after a minute (last: %v); coredns log:\n%s", url, err, controlplane.LogTail(logPath, 40))
		}
	}
}

// waitDNS waits until the server answers on UDP: CoreDNS serves /ready
// and /health from its startup hooks, before its DNS listeners are open,
// so a query right after /ready was refused once in CI.
func waitDNS(t *testing.T, server string, exited <-chan struct{}, logPath string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		conn, err := net.Dial("udp", server)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(time.Second))
		// A header-only message: any answer (FORMERR included) means the
		// listener is up; "connection refused" means it is not yet.
		_, err = conn.Write(make([]byte, 12))
		if err == nil {
			_, err = conn.Read(make([]byte, 512))
		}
		conn.Close()
		if err == nil {
			return
		}
		select {
		case <-exited:
			deadline = time.Time{}
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			t.Fatalf("CoreDNS does not answer on %s: %v\n%s", server, err, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(port)
}
