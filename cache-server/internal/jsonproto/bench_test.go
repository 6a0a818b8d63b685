package jsonproto

import (
	"crypto/rand"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func benchJSON(b *testing.B, obj any) []byte {
	data, err := json.Marshal(obj)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

func secret500KiB(b *testing.B) []byte {
	blob := make([]byte, 500<<10)
	rand.Read(blob)
	return benchJSON(b, &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "bench", ResourceVersion: "12345", CreationTimestamp: metav1.Unix(1763700000, 0), Labels: map[string]string{"app": "bench"}},
		Data:       map[string][]byte{"blob": blob},
		Type:       corev1.SecretTypeOpaque,
	})
}

// script1MiB: a ConfigMap holding a 1 MiB script, a newline (an escape in
// JSON) every 50 bytes and HTML characters the encoder escapes.
func script1MiB(b *testing.B) []byte {
	line := "if [ -n \"$X\" ] && [ $Y -lt 3 ]; then echo <ok>; fi #" // 49 bytes + newline
	return benchJSON(b, &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "scripts", Namespace: "bench"},
		Data:       map[string]string{"run.sh": strings.Repeat(line+"\n", (1<<20)/(len(line)+1))},
	})
}

func pod(b *testing.B) []byte {
	return benchJSON(b, &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "bench", ResourceVersion: "12345", CreationTimestamp: metav1.Unix(1763700000, 0), Labels: map[string]string{"app": "bench", "tier": "web"}, Annotations: map[string]string{"note": "a <b> & c"}},
		Spec: corev1.PodSpec{
			NodeName: "node-1",
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.example/app:v1", Args: []string{"--flag=1", "--other"},
				Ports:     []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")}},
				Env:       []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "2"}},
			}},
			Volumes: []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Unix(1763700100, 0)}}},
	})
}

// BenchmarkConvert compares the plan with the typed conversion it replaces
// (decode into the Go type, then Marshal).
func BenchmarkConvert(b *testing.B) {
	for _, c := range []struct {
		name string
		typ  reflect.Type
		data func(*testing.B) []byte
	}{
		{"Secret500KiB", reflect.TypeFor[corev1.Secret](), secret500KiB},
		{"Pod", reflect.TypeFor[corev1.Pod](), pod},
		{"ConfigMapScript1MiB", reflect.TypeFor[corev1.ConfigMap](), script1MiB},
	} {
		data := c.data(b)
		b.Run(c.name+"/typed", func(b *testing.B) {
			tc := newTyped()
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tc.convert(c.typ, data); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/plan", func(b *testing.B) {
			plan, err := NewPlans().For(c.typ)
			if err != nil {
				b.Fatal(err)
			}
			var buf []byte
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if buf, err = plan.Append(buf[:0], data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
