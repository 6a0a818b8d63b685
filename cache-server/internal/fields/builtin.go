package fields

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// builtin describes a built-in resource whose apiserver registers a field
// label conversion and/or selectable fields beyond metadata.
type builtin struct {
	kind string
	// convert builds the conversion for the served version (some error
	// messages name the GroupVersionKind).
	convert func(gvk schema.GroupVersionKind) func(label, value string) (string, string, error)
	extra   func(obj map[string]any, set fields.Set) error
	// reads are the object's members extra reads, as dotted paths: all
	// that SetJSON decodes (see sparse.go). A path extra walks that is
	// not here reads as absent there.
	reads []string
	// indexes are the fields kube-apiserver's watch cache indexes for the
	// resource (the registry's Indexers and TriggerFunc): it serves a
	// first LIST page with an equality on one of them from that index,
	// which decides whether the page has a continuation (see
	// Resource.APIServerIndexes).
	indexes []string
}

// allow accepts exactly labels, with the common "field label not supported"
// error.
func allow(labels ...string) func(schema.GroupVersionKind) func(string, string) (string, string, error) {
	return allowMsg(func(_ schema.GroupVersionKind, label string) string {
		return "field label not supported: " + label
	}, labels...)
}

func allowMsg(msg func(gvk schema.GroupVersionKind, label string) string, labels ...string) func(schema.GroupVersionKind) func(string, string) (string, string, error) {
	return func(gvk schema.GroupVersionKind) func(string, string) (string, string, error) {
		return func(label, value string) (string, string, error) {
			if slices.Contains(labels, label) {
				return label, value, nil
			}
			return "", "", fmt.Errorf("%s", msg(gvk, label))
		}
	}
}

// rename accepts the keys of mapping and renames them to its values.
func rename(mapping map[string]string) func(schema.GroupVersionKind) func(string, string) (string, string, error) {
	return func(schema.GroupVersionKind) func(string, string) (string, string, error) {
		return func(label, value string) (string, string, error) {
			to, ok := mapping[label]
			if !ok {
				return "", "", fmt.Errorf("field label not supported: %s", label)
			}
			return to, value, nil
		}
	}
}

// defaultConversion is runtime.DefaultMetaV1FieldSelectorConversion, for
// resources that have selectable fields but no registered conversion.
func defaultConversion(schema.GroupVersionKind) func(string, string) (string, string, error) {
	return func(label, value string) (string, string, error) {
		switch label {
		case "metadata.name", "metadata.namespace":
			return label, value, nil
		}
		return "", "", fmt.Errorf("%q is not a known field selector: only %q, %q", label, "metadata.name", "metadata.namespace")
	}
}

// builtins returns the table of built-in resources. It is built per call
// (New is called once per cached resource) so there is no package-level
// mutable state.
func builtins() map[schema.GroupResource]builtin {
	return map[schema.GroupResource]builtin{
		{Resource: "pods"}: {
			kind: "Pod",
			convert: func(schema.GroupVersionKind) func(string, string) (string, string, error) {
				base := allow("metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy",
					"spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
					"status.podIP", "status.podIPs", "status.nominatedNodeName")(schema.GroupVersionKind{})
				return func(label, value string) (string, string, error) {
					// Old v1 clients send spec.host.
					if label == "spec.host" {
						return "spec.nodeName", value, nil
					}
					return base(label, value)
				}
			},
			reads: []string{"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIPs", "status.podIP", "status.nominatedNodeName"},
			extra: func(o map[string]any, s fields.Set) error {
				s["spec.nodeName"] = str(o, "spec", "nodeName")
				s["spec.restartPolicy"] = str(o, "spec", "restartPolicy")
				s["spec.schedulerName"] = str(o, "spec", "schedulerName")
				s["spec.serviceAccountName"] = str(o, "spec", "serviceAccountName")
				s["spec.hostNetwork"] = boolean(o, "spec", "hostNetwork")
				s["status.phase"] = str(o, "status", "phase")
				s["status.podIP"] = podIP(o)
				s["status.nominatedNodeName"] = str(o, "status", "nominatedNodeName")
				return nil
			},
			indexes: []string{"spec.nodeName"}, // pkg/registry/core/pod: Indexers, NodeNameTriggerFunc
		},
		{Resource: "nodes"}: {
			kind:    "Node",
			convert: allow("metadata.name", "spec.unschedulable"),
			reads:   []string{"spec.unschedulable"},
			extra: func(o map[string]any, s fields.Set) error {
				s["spec.unschedulable"] = boolean(o, "spec", "unschedulable")
				return nil
			},
		},
		{Resource: "replicationcontrollers"}: {
			kind:    "ReplicationController",
			convert: allow("metadata.name", "metadata.namespace", "status.replicas"),
			reads:   []string{"status.replicas"},
			extra: func(o map[string]any, s fields.Set) error {
				s["status.replicas"] = integer(o, "status", "replicas")
				return nil
			},
		},
		{Resource: "events"}: {
			kind: "Event",
			convert: allow("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
				"involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
				"involvedObject.fieldPath", "reason", "reportingComponent", "source", "type",
				"metadata.namespace", "metadata.name"),
			reads: eventReads("involvedObject", "reportingComponent", "source"),
			extra: func(o map[string]any, s fields.Set) error {
				eventFields(o, s, "involvedObject", "reportingComponent", "source")
				return nil
			},
		},
		{Group: "events.k8s.io", Resource: "events"}: {
			kind: "Event",
			convert: rename(map[string]string{
				"reason":                    "reason",
				"regarding.kind":            "involvedObject.kind",
				"regarding.namespace":       "involvedObject.namespace",
				"regarding.name":            "involvedObject.name",
				"regarding.uid":             "involvedObject.uid",
				"regarding.apiVersion":      "involvedObject.apiVersion",
				"regarding.resourceVersion": "involvedObject.resourceVersion",
				"regarding.fieldPath":       "involvedObject.fieldPath",
				"reportingController":       "reportingComponent",
				"type":                      "type",
				"metadata.namespace":        "metadata.namespace",
				"metadata.name":             "metadata.name",
			}),
			reads: eventReads("regarding", "reportingController", "deprecatedSource"),
			extra: func(o map[string]any, s fields.Set) error {
				// Same internal field names as core/v1 events: the apiserver
				// converts events.k8s.io/v1 into the internal core Event.
				eventFields(o, s, "regarding", "reportingController", "deprecatedSource")
				return nil
			},
		},
		{Resource: "namespaces"}: {
			kind:    "Namespace",
			convert: allow("status.phase", "metadata.name"),
			reads:   []string{"status.phase"},
			extra: func(o map[string]any, s fields.Set) error {
				s["status.phase"] = str(o, "status", "phase")
				s["name"] = str(o, "metadata", "name") // kept by the apiserver for backward compatibility
				return nil
			},
		},
		{Resource: "secrets"}: {
			kind:    "Secret",
			convert: allow("type", "metadata.namespace", "metadata.name"),
			reads:   []string{"type"},
			extra: func(o map[string]any, s fields.Set) error {
				s["type"] = str(o, "type")
				return nil
			},
		},
		{Resource: "services"}: {
			kind:    "Service",
			convert: allow("metadata.namespace", "metadata.name", "spec.clusterIP", "spec.type"),
			reads:   []string{"spec.clusterIP", "spec.type"},
			extra: func(o map[string]any, s fields.Set) error {
				s["spec.clusterIP"] = str(o, "spec", "clusterIP")
				s["spec.type"] = str(o, "spec", "type")
				return nil
			},
		},
		// The set has "name" but no conversion accepts it: unreachable, mirrored
		// for fidelity.
		{Resource: "persistentvolumes"}: {
			kind: "PersistentVolume", convert: defaultConversion,
			extra: func(o map[string]any, s fields.Set) error { s["name"] = str(o, "metadata", "name"); return nil },
		},
		{Resource: "persistentvolumeclaims"}: {
			kind: "PersistentVolumeClaim", convert: defaultConversion,
			extra: func(o map[string]any, s fields.Set) error { s["name"] = str(o, "metadata", "name"); return nil },
		},
		{Group: "apps", Resource: "replicasets"}: {
			kind: "ReplicaSet", convert: defaultConversion,
			reads: []string{"status.replicas"},
			extra: func(o map[string]any, s fields.Set) error {
				s["status.replicas"] = integer(o, "status", "replicas")
				return nil
			},
		},
		{Group: "batch", Resource: "jobs"}: {
			kind: "Job",
			convert: allowMsg(func(_ schema.GroupVersionKind, label string) string {
				return fmt.Sprintf("field label %q not supported for Job", label)
			}, "metadata.name", "metadata.namespace", "status.successful"),
			reads: []string{"status.succeeded"},
			extra: func(o map[string]any, s fields.Set) error {
				s["status.successful"] = integer(o, "status", "succeeded")
				return nil
			},
		},
		{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}: {
			kind:    "CertificateSigningRequest",
			convert: allow("metadata.name", "spec.signerName"),
			reads:   []string{"spec.signerName"},
			extra:   signerName,
		},
		{Group: "certificates.k8s.io", Resource: "clustertrustbundles"}: {
			kind:    "ClusterTrustBundle",
			convert: allow("metadata.name", "spec.signerName"),
			reads:   []string{"spec.signerName"},
			extra:   signerName,
		},
		{Group: "certificates.k8s.io", Resource: "podcertificaterequests"}: {
			kind:    "PodCertificateRequest",
			convert: allow("metadata.name", "spec.signerName", "spec.podName", "spec.nodeName"),
			reads:   []string{"spec.signerName", "spec.podName", "spec.nodeName"},
			extra: func(o map[string]any, s fields.Set) error {
				s["spec.signerName"] = str(o, "spec", "signerName")
				s["spec.podName"] = str(o, "spec", "podName")
				s["spec.nodeName"] = str(o, "spec", "nodeName")
				return nil
			},
		},
		{Group: "resource.k8s.io", Resource: "resourceslices"}: {
			kind: "ResourceSlice",
			convert: allowMsg(func(gvk schema.GroupVersionKind, label string) string {
				return fmt.Sprintf("field label not supported for %s: %s", gvk, label)
			}, "metadata.name", "spec.nodeName", "spec.driver", "spec.pool.name"),
			reads: []string{"spec.nodeName", "spec.driver", "spec.pool.name"},
			extra: func(o map[string]any, s fields.Set) error {
				s["spec.nodeName"] = str(o, "spec", "nodeName")
				s["spec.driver"] = str(o, "spec", "driver")
				s["spec.pool.name"] = str(o, "spec", "pool", "name")
				return nil
			},
			indexes: []string{"spec.nodeName"}, // pkg/registry/resource/resourceslice: Indexers, TriggerFunc
		},
		{Group: "coordination.k8s.io", Resource: "leasecandidates"}: {
			kind: "LeaseCandidate", convert: defaultConversion,
			reads: []string{"spec.leaseName"},
			extra: func(o map[string]any, s fields.Set) error {
				s["spec.leaseName"] = str(o, "spec", "leaseName")
				return nil
			},
		},
	}
}

func signerName(o map[string]any, s fields.Set) error {
	s["spec.signerName"] = str(o, "spec", "signerName")
	return nil
}

// podIP is the internal pod's status.podIPs[0].ip: the v1 → internal
// conversion fills podIPs from podIP when only the latter is set.
func podIP(o map[string]any) string {
	if ips, ok := get(o, "status", "podIPs"); ok {
		if list, ok := ips.([]any); ok && len(list) > 0 {
			if first, ok := list[0].(map[string]any); ok {
				return str(first, "ip")
			}
		}
	}
	return str(o, "status", "podIP")
}

// eventReads are the members eventFields reads.
func eventReads(involved, reportingController, source string) []string {
	var r []string
	for _, f := range eventInvolvedFields() {
		r = append(r, involved+"."+f)
	}
	return append(r, "reason", reportingController, source+".component", "type")
}

// eventInvolvedFields are the involved object's selectable fields.
func eventInvolvedFields() []string {
	return []string{"kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath"}
}

// eventFields fills the internal Event's selectable fields (registry
// core/event ToSelectableFields) from a core/v1 or events.k8s.io/v1 object,
// whose field names differ.
func eventFields(o map[string]any, s fields.Set, involved, reportingController, source string) {
	for _, f := range eventInvolvedFields() {
		s["involvedObject."+f] = str(o, involved, f)
	}
	s["reason"] = str(o, "reason")
	rc := str(o, reportingController)
	s["reportingComponent"] = rc
	src := str(o, source, "component")
	if src == "" {
		src = rc
	}
	s["source"] = src
	s["type"] = str(o, "type")
}
