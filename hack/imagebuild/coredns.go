package imagebuild

// corednsModule is the module hack/coredns-build pins (at an exact version
// in its go.mod); the version becomes part of the CoreDNS image's tag.
const corednsModule = "github.com/coredns/coredns"

// Corefile is the CoreDNS configuration for the test node's cluster DNS,
// for a ConfigMap mounted at /etc/coredns (run `/coredns -conf
// /etc/coredns/Corefile`). It follows kubeadm's, with one difference: no
// `forward`. Pods must never reach the machine's resolver (the network
// rule), so names outside the cluster get NXDOMAIN at once rather than a
// timeout, and the CoreDNS build does not even link the forward plugin.
//
// The server blocks name no port: CoreDNS serves on 53 unless started with
// -dns.port. The image runs as uid 65532, which may bind 53 only where the
// pod allows it: the safe sysctl net.ipv4.ip_unprivileged_port_start=53 in
// the pod's securityContext (or containerd's enable_unprivileged_ports), or
// -dns.port=1053 with the Service's targetPort 1053.
//
//   - kubernetes: Services and Pods of cluster.local, and reverse lookups
//     of their IPs; `pods insecure` answers a-b-c-d.ns.pod.cluster.local as
//     kubeadm does; ttl 30 as the issue asks (kubeadm's default is 30 too).
//     No fallthrough: a reverse name it does not know is NXDOMAIN.
//   - health :8080 (liveness; lameduck keeps answering 5s after SIGTERM)
//     and ready :8181 (readiness: the kubernetes plugin has synced).
//   - prometheus :9153, cache 30, loop, reload (picks up ConfigMap
//     edits), loadbalance, errors: kubeadm's.
const Corefile = `cluster.local in-addr.arpa ip6.arpa {
    errors
    health :8080 {
        lameduck 5s
    }
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        ttl 30
    }
    prometheus :9153
    cache 30
    loop
    reload
    loadbalance
}
. {
    errors
    template ANY ANY {
        rcode NXDOMAIN
    }
}
`
