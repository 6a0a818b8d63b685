package front

import (
	"bytes"
	"fmt"
	"testing"
)

// BenchmarkServeListByNode serves LIST pods by node
// (fieldSelector=spec.nodeName=<node>) through Server.ServeHTTP, as
// benchServeList does: pods of about 2.5 KiB, pod i on node i%nodes, at
// resourceVersion=0 and consistent (the RV fetch from the fake apiserver
// included). index: the store keeps pods' spec.nodeName index (the
// default); scan: it keeps none, so the read filters every pod.
func BenchmarkServeListByNode(b *testing.B) {
	for _, size := range []struct{ pods, nodes int }{{10000, 500}, {50000, 2000}} {
		node := func(i int) string { return fmt.Sprintf("node-%04d", i%size.nodes) }
		objs := podsJSON(size.pods, 2048, node, func(int) string { return "Running" })
		for _, mode := range []string{"index", "scan"} {
			t := newBenchTierOf(b, objs, benchResource{resource: "pods", kind: "Pod", noIndexes: mode == "scan"}, true, false)
			for _, rv := range []string{"0", ""} {
				read := "rv0"
				if rv == "" {
					read = "consistent"
				}
				b.Run(fmt.Sprintf("pods=%d/nodes=%d/%s/%s", size.pods, size.nodes, read, mode), func(b *testing.B) {
					body := &bytes.Buffer{}
					i := 0
					b.ReportAllocs()
					for b.Loop() {
						q := "?fieldSelector=spec.nodeName%3D" + node(i)
						if rv != "" {
							q += "&resourceVersion=" + rv
						}
						i++
						t.get(b, body, "/api/v1/pods"+q, nil)
					}
				})
			}
			t.stop()
		}
	}
}
