package cluster

import (
	"context"
	"fmt"
	"net"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/cachetier/cachetier/hack/imagebuild"
)

// dnsPort is where CoreDNS listens inside its pod: above 1024, so the
// container (uid 65532) needs no capability; the Service maps 53 to it.
const dnsPort = 1053

// DNSObjects are the cluster DNS's objects, as kubeadm deploys CoreDNS:
// ServiceAccount, ClusterRole(+Binding) to read Services and
// EndpointSlices, the Corefile, a Deployment and the kube-dns Service on the
// address every kubelet hands its pods. As kubeadm does, two replicas that
// prefer different nodes when there are several: a cluster's names must
// outlive the node one CoreDNS runs on.
func DNSObjects(a Addresses, image string) (sa *corev1.ServiceAccount, role *rbacv1.ClusterRole, binding *rbacv1.ClusterRoleBinding,
	cm *corev1.ConfigMap, deploy *appsv1.Deployment, svc *corev1.Service) {
	const ns, name = "kube-system", "coredns"
	labels := map[string]string{"k8s-app": "kube-dns"}
	meta := func(n string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: n, Namespace: ns, Labels: labels}
	}
	sa = &corev1.ServiceAccount{ObjectMeta: meta(name)}
	role = &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "system:coredns", Labels: labels},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		},
	}
	binding = &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "system:coredns", Labels: labels},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
	}
	cm = &corev1.ConfigMap{ObjectMeta: meta(name), Data: map[string]string{"Corefile": imagebuild.Corefile}}
	httpProbe := func(path string, port int) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(int32(port))}},
			PeriodSeconds: 2, TimeoutSeconds: 1, FailureThreshold: 5,
		}
	}
	deploy = &appsv1.Deployment{
		ObjectMeta: meta(name),
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(DNSReplicas(len(a.Nodes))),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: name,
					PriorityClassName:  "system-cluster-critical",
					DNSPolicy:          corev1.DNSDefault,
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
							Weight: 100,
							PodAffinityTerm: corev1.PodAffinityTerm{
								TopologyKey:   corev1.LabelHostname,
								LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
							},
						}},
					}},
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:            name,
						Image:           image,
						ImagePullPolicy: corev1.PullNever,
						Args:            []string{"-conf", "/etc/coredns/Corefile", fmt.Sprintf("-dns.port=%d", dnsPort)},
						Ports: []corev1.ContainerPort{
							{Name: "dns", ContainerPort: dnsPort, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: dnsPort, Protocol: corev1.ProtocolTCP},
						},
						VolumeMounts:   []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns", ReadOnly: true}},
						ReadinessProbe: httpProbe("/ready", 8181),
						LivenessProbe:  httpProbe("/health", 8080),
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false),
							ReadOnlyRootFilesystem:   ptr.To(true),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						Resources: corev1.ResourceRequirements{},
					}},
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
						ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}},
					}}},
				},
			},
		},
	}
	svc = &corev1.Service{
		ObjectMeta: meta("kube-dns"),
		Spec: corev1.ServiceSpec{
			Selector:  labels,
			ClusterIP: a.DNSServiceIP.String(),
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(dnsPort), Protocol: corev1.ProtocolUDP},
				{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromInt32(dnsPort), Protocol: corev1.ProtocolTCP},
			},
		},
	}
	return sa, role, binding, cm, deploy, svc
}

// DNSReplicas is how many CoreDNS pods a cluster of nodes nodes runs: one
// on one node, two (kubeadm's number) otherwise.
func DNSReplicas(nodes int) int32 { return int32(min(nodes, 2)) }

// deployDNS creates CoreDNS and waits until it answers, from the host,
// through the kube-dns ClusterIP: that exercises the Service, kube-proxy's
// rules, the pod network and CoreDNS's view of the API in one query.
func (c *Cluster) deployDNS(ctx context.Context) error {
	cs, _, err := c.Clientset()
	if err != nil {
		return err
	}
	sa, role, binding, cm, deploy, svc := DNSObjects(c.Addresses, c.opts.CoreDNSImage)
	if _, err := cs.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create CoreDNS ServiceAccount: %w", err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create CoreDNS ClusterRole: %w", err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create CoreDNS ClusterRoleBinding: %w", err)
	}
	if _, err := cs.CoreV1().ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create CoreDNS ConfigMap: %w", err)
	}
	if _, err := cs.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create kube-dns Service: %w", err)
	}
	if _, err := cs.AppsV1().Deployments(deploy.Namespace).Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create CoreDNS Deployment: %w", err)
	}
	if err := c.WaitPodsReady(ctx, "kube-system", "k8s-app=kube-dns", int(DNSReplicas(len(c.Nodes))), c.opts.ReadyTimeout); err != nil {
		return fmt.Errorf("cluster DNS: %w", err)
	}
	want := c.Addresses.APIServerServiceIP.String()
	return waitFor(ctx, "kubernetes.default.svc.cluster.local to resolve to "+want+" through "+c.Addresses.DNSServiceIP.String(),
		30*time.Second, c.Exited,
		func(ctx context.Context) (string, bool) {
			addrs, err := c.Resolver().LookupHost(ctx, "kubernetes.default.svc.cluster.local")
			if err != nil {
				return err.Error(), false
			}
			return fmt.Sprint(addrs), len(addrs) == 1 && addrs[0] == want
		},
		func(ctx context.Context) string { return c.DescribePods(ctx, cs, "kube-system", "k8s-app=kube-dns") })
}

// Resolver asks the cluster DNS (and only it) from this host, as a pod
// would.
func (c *Cluster) Resolver() *net.Resolver {
	server := net.JoinHostPort(c.Addresses.DNSServiceIP.String(), "53")
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		d.Timeout = 2 * time.Second
		return d.DialContext(ctx, network, server)
	}}
}
