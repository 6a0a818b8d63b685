package controllers

import (
	"context"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/internal/alerts"
)

// The Prometheus Operator CRDs whose presence makes the operator create a
// ServiceMonitor and a PrometheusRule per profile.
const (
	ServiceMonitorCRDName = "servicemonitors.monitoring.coreos.com"
	PrometheusRuleCRDName = "prometheusrules.monitoring.coreos.com"
)

// Monitoring says which Prometheus Operator kinds the cluster serves.
type Monitoring struct {
	ServiceMonitor bool
	PrometheusRule bool
}

func isMonitoringCRD(name string) bool {
	return name == ServiceMonitorCRDName || name == PrometheusRuleCRDName
}

// BuildPrometheusRule holds the alerts about one profile's fleet
// (internal/alerts.FleetRules), scoped to the jobs its ServiceMonitor
// creates. The alerts about the operator itself and every profile's shard
// readiness ship in config/prometheus (alerts.OperatorRules).
func BuildPrometheusRule(p *cachev1alpha1.CacheProfile, opts Options) (*unstructured.Unstructured, error) {
	obj, err := alerts.PrometheusRule(p.Name, opts.Namespace, commonLabels(p, ComponentFront),
		alerts.FleetRules(alerts.FleetScope{Namespace: opts.Namespace, Profile: p.Name}))
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetOwnerReferences(ownerRefs(p))
	return u, nil
}

func (r *CacheProfileReconciler) crdPresent(ctx context.Context, name string) (bool, error) {
	crd := &metav1.PartialObjectMetadata{}
	crd.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
	err := r.Client.Get(ctx, types.NamespacedName{Name: name}, crd)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil && crd.DeletionTimestamp.IsZero(), err
}

func (r *CacheProfileReconciler) monitoring(ctx context.Context) (Monitoring, error) {
	sm, err := r.crdPresent(ctx, ServiceMonitorCRDName)
	if err != nil {
		return Monitoring{}, err
	}
	pr, err := r.crdPresent(ctx, PrometheusRuleCRDName)
	return Monitoring{ServiceMonitor: sm, PrometheusRule: pr}, err
}
