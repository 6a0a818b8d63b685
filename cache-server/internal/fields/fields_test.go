package fields

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func decode(t *testing.T, s string) map[string]any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader([]byte(s)))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

func mustNew(t *testing.T, spec Spec) *Resource {
	t.Helper()
	r, err := New(spec)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func gvr(g, v, r string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: g, Version: v, Resource: r}
}

func TestSet(t *testing.T) {
	cases := []struct {
		name string
		spec Spec
		obj  string
		want fields.Set
	}{
		{"pod", Spec{GVR: gvr("", "v1", "pods"), Namespaced: true}, `{
			"metadata":{"name":"p","namespace":"ns"},
			"spec":{"nodeName":"n1","restartPolicy":"Always","schedulerName":"default-scheduler","serviceAccountName":"sa","hostNetwork":true},
			"status":{"phase":"Running","podIP":"10.0.0.1","podIPs":[{"ip":"10.0.0.2"},{"ip":"fd00::1"}],"nominatedNodeName":"n2"}}`,
			fields.Set{"metadata.name": "p", "metadata.namespace": "ns", "spec.nodeName": "n1", "spec.restartPolicy": "Always",
				"spec.schedulerName": "default-scheduler", "spec.serviceAccountName": "sa", "spec.hostNetwork": "true",
				"status.phase": "Running", "status.podIP": "10.0.0.2", "status.nominatedNodeName": "n2"}},
		{"pod with only podIP and defaults", Spec{GVR: gvr("", "v1", "pods"), Namespaced: true}, `{
			"metadata":{"name":"p","namespace":"ns"},"spec":{},"status":{"podIP":"10.0.0.9"}}`,
			fields.Set{"metadata.name": "p", "metadata.namespace": "ns", "spec.nodeName": "", "spec.restartPolicy": "",
				"spec.schedulerName": "", "spec.serviceAccountName": "", "spec.hostNetwork": "false",
				"status.phase": "", "status.podIP": "10.0.0.9", "status.nominatedNodeName": ""}},
		{"node", Spec{GVR: gvr("", "v1", "nodes")}, `{"metadata":{"name":"n"},"spec":{"unschedulable":true}}`,
			fields.Set{"metadata.name": "n", "spec.unschedulable": "true"}},
		{"node default", Spec{GVR: gvr("", "v1", "nodes")}, `{"metadata":{"name":"n"}}`,
			fields.Set{"metadata.name": "n", "spec.unschedulable": "false"}},
		{"namespace", Spec{GVR: gvr("", "v1", "namespaces")}, `{"metadata":{"name":"kube-system"},"status":{"phase":"Active"}}`,
			fields.Set{"metadata.name": "kube-system", "status.phase": "Active", "name": "kube-system"}},
		{"secret", Spec{GVR: gvr("", "v1", "secrets"), Namespaced: true}, `{"metadata":{"name":"s","namespace":"ns"},"type":"kubernetes.io/tls"}`,
			fields.Set{"metadata.name": "s", "metadata.namespace": "ns", "type": "kubernetes.io/tls"}},
		{"service", Spec{GVR: gvr("", "v1", "services"), Namespaced: true}, `{"metadata":{"name":"s","namespace":"ns"},"spec":{"clusterIP":"10.96.0.1","type":"ClusterIP"}}`,
			fields.Set{"metadata.name": "s", "metadata.namespace": "ns", "spec.clusterIP": "10.96.0.1", "spec.type": "ClusterIP"}},
		{"rc", Spec{GVR: gvr("", "v1", "replicationcontrollers"), Namespaced: true}, `{"metadata":{"name":"r","namespace":"ns"},"status":{"replicas":3}}`,
			fields.Set{"metadata.name": "r", "metadata.namespace": "ns", "status.replicas": "3"}},
		{"replicaset without status", Spec{GVR: gvr("apps", "v1", "replicasets"), Namespaced: true}, `{"metadata":{"name":"r","namespace":"ns"}}`,
			fields.Set{"metadata.name": "r", "metadata.namespace": "ns", "status.replicas": "0"}},
		{"job", Spec{GVR: gvr("batch", "v1", "jobs"), Namespaced: true}, `{"metadata":{"name":"j","namespace":"ns"},"status":{"succeeded":2}}`,
			fields.Set{"metadata.name": "j", "metadata.namespace": "ns", "status.successful": "2"}},
		{"core event", Spec{GVR: gvr("", "v1", "events"), Namespaced: true}, `{"metadata":{"name":"e","namespace":"ns"},
			"involvedObject":{"kind":"Pod","namespace":"ns","name":"p","uid":"u1","apiVersion":"v1","resourceVersion":"5","fieldPath":"spec.containers{a}"},
			"reason":"Started","reportingComponent":"kubelet","source":{"component":"kubelet-src"},"type":"Normal"}`,
			fields.Set{"metadata.name": "e", "metadata.namespace": "ns", "involvedObject.kind": "Pod", "involvedObject.namespace": "ns",
				"involvedObject.name": "p", "involvedObject.uid": "u1", "involvedObject.apiVersion": "v1", "involvedObject.resourceVersion": "5",
				"involvedObject.fieldPath": "spec.containers{a}", "reason": "Started", "reportingComponent": "kubelet", "source": "kubelet-src", "type": "Normal"}},
		{"events.k8s.io event, source falls back to reportingController", Spec{GVR: gvr("events.k8s.io", "v1", "events"), Namespaced: true}, `{"metadata":{"name":"e","namespace":"ns"},
			"regarding":{"kind":"Node","name":"n1"},"reason":"Ready","reportingController":"ctrl","type":"Warning"}`,
			fields.Set{"metadata.name": "e", "metadata.namespace": "ns", "involvedObject.kind": "Node", "involvedObject.namespace": "",
				"involvedObject.name": "n1", "involvedObject.uid": "", "involvedObject.apiVersion": "", "involvedObject.resourceVersion": "",
				"involvedObject.fieldPath": "", "reason": "Ready", "reportingComponent": "ctrl", "source": "ctrl", "type": "Warning"}},
		{"csr", Spec{GVR: gvr("certificates.k8s.io", "v1", "certificatesigningrequests")}, `{"metadata":{"name":"c"},"spec":{"signerName":"kubernetes.io/kubelet-serving"}}`,
			fields.Set{"metadata.name": "c", "spec.signerName": "kubernetes.io/kubelet-serving"}},
		{"resourceslice", Spec{GVR: gvr("resource.k8s.io", "v1", "resourceslices")}, `{"metadata":{"name":"rs"},"spec":{"driver":"gpu.example.com","pool":{"name":"p0"}}}`,
			fields.Set{"metadata.name": "rs", "spec.nodeName": "", "spec.driver": "gpu.example.com", "spec.pool.name": "p0"}},
		{"configmap (no extra fields)", Spec{GVR: gvr("", "v1", "configmaps"), Namespaced: true}, `{"metadata":{"name":"c","namespace":"ns"},"data":{"a":"b"}}`,
			fields.Set{"metadata.name": "c", "metadata.namespace": "ns"}},
		{"clusterrole (cluster-scoped default)", Spec{GVR: gvr("rbac.authorization.k8s.io", "v1", "clusterroles")}, `{"metadata":{"name":"admin"}}`,
			fields.Set{"metadata.name": "admin"}},
		{"crd", Spec{GVR: gvr("example.com", "v1", "widgets"), Namespaced: true, Custom: true,
			SelectableFields: []string{".spec.color", ".spec.size", ".spec.enabled", ".spec.missing", ".status.big"}},
			`{"metadata":{"name":"w","namespace":"ns"},"spec":{"color":"blue","size":3,"enabled":false},"status":{"big":9007199254740993}}`,
			fields.Set{"metadata.name": "w", "metadata.namespace": "ns", "spec.color": "blue", "spec.size": "3",
				"spec.enabled": "false", "spec.missing": "", "status.big": "9007199254740993"}},
	}
	for _, c := range cases {
		r := mustNew(t, c.spec)
		got, err := r.Set(decode(t, c.obj))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !maps.Equal(got, c.want) {
			t.Errorf("%s:\n got %v\nwant %v", c.name, got, c.want)
		}
	}
}

// TestSetWithoutUseNumber covers objects decoded into float64 numbers.
func TestSetWithoutUseNumber(t *testing.T) {
	var m map[string]any
	if err := json.Unmarshal([]byte(`{"metadata":{"name":"j","namespace":"ns"},"status":{"succeeded":12}}`), &m); err != nil {
		t.Fatal(err)
	}
	got, err := mustNew(t, Spec{GVR: gvr("batch", "v1", "jobs"), Namespaced: true}).Set(m)
	if err != nil || got["status.successful"] != "12" {
		t.Fatalf("%v %v", got, err)
	}
}

func TestValidateSelector(t *testing.T) {
	cases := []struct {
		spec     Spec
		selector string
		want     string // converted selector, or error message
		ok       bool
	}{
		{Spec{GVR: gvr("", "v1", "pods"), Namespaced: true}, "spec.nodeName=n1,status.phase!=Failed", "spec.nodeName=n1,status.phase!=Failed", true},
		{Spec{GVR: gvr("", "v1", "pods"), Namespaced: true}, "spec.host=n1", "spec.nodeName=n1", true},
		{Spec{GVR: gvr("", "v1", "pods"), Namespaced: true}, "status.podIPs=1.2.3.4", "status.podIPs=1.2.3.4", true},
		{Spec{GVR: gvr("", "v1", "pods"), Namespaced: true}, "foo=bar", "field label not supported: foo", false},
		{Spec{GVR: gvr("", "v1", "nodes")}, "metadata.namespace=x", "field label not supported: metadata.namespace", false},
		{Spec{GVR: gvr("", "v1", "configmaps"), Namespaced: true}, "data.a=b", `"data.a" is not a known field selector: only "metadata.name", "metadata.namespace"`, false},
		{Spec{GVR: gvr("apps", "v1", "replicasets"), Namespaced: true}, "status.replicas=1", `"status.replicas" is not a known field selector: only "metadata.name", "metadata.namespace"`, false},
		{Spec{GVR: gvr("batch", "v1", "jobs"), Namespaced: true}, "status.active=1", `field label "status.active" not supported for Job`, false},
		{Spec{GVR: gvr("resource.k8s.io", "v1", "resourceslices")}, "spec.foo=x", "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: spec.foo", false},
		{Spec{GVR: gvr("events.k8s.io", "v1", "events"), Namespaced: true}, "regarding.name=p,reportingController=c", "involvedObject.name=p,reportingComponent=c", true},
		{Spec{GVR: gvr("events.k8s.io", "v1", "events"), Namespaced: true}, "source=kubelet", "field label not supported: source", false},
		{Spec{GVR: gvr("", "v1", "events"), Namespaced: true}, "source=kubelet,involvedObject.uid=u", "involvedObject.uid=u,source=kubelet", true},
		{Spec{GVR: gvr("example.com", "v1", "widgets"), Namespaced: true, Custom: true, SelectableFields: []string{".spec.color"}}, "spec.color=blue,metadata.namespace=ns", "metadata.namespace=ns,spec.color=blue", true},
		{Spec{GVR: gvr("example.com", "v1", "widgets"), Namespaced: true, Custom: true, SelectableFields: []string{".spec.color"}}, "spec.size=1", "field label not supported: spec.size", false},
		{Spec{GVR: gvr("example.com", "v1", "globals"), Custom: true}, "metadata.namespace=x", "field label not supported: metadata.namespace", false},
	}
	for _, c := range cases {
		sel, err := fields.ParseSelector(c.selector)
		if err != nil {
			t.Fatal(err)
		}
		out, err := mustNew(t, c.spec).ValidateSelector(sel)
		if c.ok {
			if err != nil || out.String() != c.want {
				t.Errorf("%s %q: got %v %v, want %q", c.spec.GVR, c.selector, out, err, c.want)
			}
			continue
		}
		var se *apierrors.StatusError
		if !errors.As(err, &se) {
			t.Errorf("%s %q: err %#v", c.spec.GVR, c.selector, err)
			continue
		}
		if se.ErrStatus.Code != http.StatusBadRequest || se.ErrStatus.Reason != metav1.StatusReasonBadRequest || se.ErrStatus.Message != c.want {
			t.Errorf("%s %q: got %d %s %q, want 400 BadRequest %q", c.spec.GVR, c.selector, se.ErrStatus.Code, se.ErrStatus.Reason, se.ErrStatus.Message, c.want)
		}
	}
	if out, err := mustNew(t, Spec{GVR: gvr("", "v1", "pods")}).ValidateSelector(nil); err != nil || !out.Empty() {
		t.Errorf("nil selector: %v %v", out, err)
	}
}

// TestMatchEndToEnd matches converted selectors against computed sets,
// including the apiserver quirks.
func TestMatchEndToEnd(t *testing.T) {
	pods := mustNew(t, Spec{GVR: gvr("", "v1", "pods"), Namespaced: true})
	set, err := pods.Set(decode(t, `{"metadata":{"name":"p","namespace":"ns"},"spec":{"nodeName":"n1"},"status":{"podIPs":[{"ip":"10.0.0.2"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	for sel, want := range map[string]bool{
		"spec.host=n1":           true,
		"spec.nodeName=n2":       false,
		"spec.hostNetwork=false": true,
		// status.podIPs is accepted but never set: only "" matches.
		"status.podIPs=10.0.0.2": false,
		"status.podIPs=":         true,
		"status.podIP=10.0.0.2":  true,
		"metadata.namespace!=ns": false,
	} {
		s, _ := fields.ParseSelector(sel)
		conv, err := pods.ValidateSelector(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := conv.Matches(set); got != want {
			t.Errorf("%q matches = %v, want %v", sel, got, want)
		}
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := New(Spec{GVR: gvr("", "v1", "pods"), SelectableFields: []string{".spec.x"}}); err == nil {
		t.Error("selectableFields on a built-in must fail")
	}
	if _, err := New(Spec{GVR: gvr("example.com", "v1", "w"), Custom: true, SelectableFields: []string{".spec[x"}}); err == nil {
		t.Error("bad JSONPath must fail")
	}
	// A path that yields several values is an error at match time, as in
	// the apiserver.
	r := mustNew(t, Spec{GVR: gvr("example.com", "v1", "w"), Custom: true, SelectableFields: []string{".spec.items[*]"}})
	if _, err := r.Set(decode(t, `{"metadata":{"name":"a"},"spec":{"items":[1,2]}}`)); err == nil {
		t.Error("multiple JSONPath results must fail")
	}
}

// TestIndexes: the apiserver's own indexes per resource, and which fields a
// profile may index.
func TestIndexes(t *testing.T) {
	pods := mustNew(t, Spec{GVR: gvr("", "v1", "pods"), Kind: "Pod", Namespaced: true})
	if got := pods.APIServerIndexes(); len(got) != 1 || got[0] != "spec.nodeName" {
		t.Errorf("pods: APIServerIndexes %v", got)
	}
	slices := mustNew(t, Spec{GVR: gvr("resource.k8s.io", "v1", "resourceslices"), Kind: "ResourceSlice"})
	if got := slices.APIServerIndexes(); len(got) != 1 || got[0] != "spec.nodeName" {
		t.Errorf("resourceslices: APIServerIndexes %v", got)
	}
	cms := mustNew(t, Spec{GVR: gvr("", "v1", "configmaps"), Kind: "ConfigMap", Namespaced: true})
	if got := cms.APIServerIndexes(); len(got) != 0 {
		t.Errorf("configmaps: APIServerIndexes %v", got)
	}
	widgets := mustNew(t, Spec{GVR: gvr("example.com", "v1", "widgets"), Namespaced: true, Custom: true, SelectableFields: []string{".spec.color"}})
	for _, c := range []struct {
		r     *Resource
		field string
		ok    bool
	}{
		{pods, "spec.nodeName", true},
		{pods, "status.phase", true},
		{pods, "metadata.name", true},
		{pods, "spec.host", false},          // selectors call it spec.nodeName
		{pods, "metadata.namespace", false}, // keys are already in namespace order
		{pods, "spec.nope", false},
		{cms, "metadata.name", true},
		{cms, "data.x", false},
		{widgets, "spec.color", true},
		{widgets, "spec.size", false},
	} {
		if err := c.r.CheckIndex(c.field); (err == nil) != c.ok {
			t.Errorf("%s CheckIndex(%q) = %v, want ok=%v", c.r.spec.GVR.Resource, c.field, err, c.ok)
		}
	}
}
