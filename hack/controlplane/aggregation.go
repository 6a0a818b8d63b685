package controlplane

import (
	"context"
	"fmt"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregator "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"k8s.io/utils/ptr"
)

// PlaceholderEndpointIP is a documentation address (RFC 5737) put in the
// EndpointSlice of an aggregated API's Service. The aggregator only needs a
// ready endpoint to mark the APIService Available; it dials the ClusterIP,
// which on this machine is a loopback address the server listens on.
const PlaceholderEndpointIP = "192.0.2.10"

// APIServiceRegistration describes an aggregated API served from a process on
// this machine at ClusterIP:Port.
type APIServiceRegistration struct {
	Group, Version string
	Namespace      string // of the Service; created if missing
	ServiceName    string
	ClusterIP      string // must be inside the control plane's service range
	Port           int32
	CABundle       []byte // CA of the server's serving certificate
}

// ServiceIP returns the n-th address of the service ClusterIP range (n >= 2:
// the first is taken by the `kubernetes` Service).
func (cp *ControlPlane) ServiceIP(n int) string {
	_, ipnet, err := net.ParseCIDR(cp.ServiceClusterIPRange)
	if err != nil {
		return ""
	}
	ip := ipnet.IP.To4()
	out := net.IPv4(ip[0], ip[1], ip[2], ip[3]+byte(n))
	return out.String()
}

// RegisterAPIService creates the Service (explicit ClusterIP), a placeholder
// EndpointSlice and the APIService, then waits until the aggregator reports
// the APIService Available (which requires the server to answer discovery).
func (cp *ControlPlane) RegisterAPIService(ctx context.Context, reg APIServiceRegistration) error {
	cfg, err := cp.RESTConfig()
	if err != nil {
		return err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ac, err := aggregator.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: reg.Namespace}}
	if _, err := kc.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: reg.ServiceName, Namespace: reg.Namespace},
		Spec: corev1.ServiceSpec{
			ClusterIP: reg.ClusterIP,
			Ports:     []corev1.ServicePort{{Name: "https", Port: reg.Port, TargetPort: intstr.FromInt32(reg.Port)}},
		},
	}
	if _, err := kc.CoreV1().Services(reg.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create service: %w", err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: reg.ServiceName, Namespace: reg.Namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: reg.ServiceName},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{PlaceholderEndpointIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(reg.Port), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if _, err := kc.DiscoveryV1().EndpointSlices(reg.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create endpointslice: %w", err)
	}
	name := reg.Version + "." + reg.Group
	apisvc := &apiregv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: apiregv1.APIServiceSpec{
			Group: reg.Group, Version: reg.Version,
			Service:              &apiregv1.ServiceReference{Namespace: reg.Namespace, Name: reg.ServiceName, Port: ptr.To(reg.Port)},
			CABundle:             reg.CABundle,
			GroupPriorityMinimum: 1000,
			VersionPriority:      15,
		},
	}
	if _, err := ac.ApiregistrationV1().APIServices().Create(ctx, apisvc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create apiservice: %w", err)
	}
	var last string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := ac.ApiregistrationV1().APIServices().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiregv1.Available {
				last = fmt.Sprintf("%s: %s", c.Reason, c.Message)
				return c.Status == apiregv1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("APIService %s not Available: %s: %w", name, last, err)
	}
	return nil
}
