package store

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// benchPods are n pods in 20 namespaces, pod i on node i%nodes, as
// ingestion stores them (key, labels, field values; the bytes do not
// matter to a store read).
func benchPods(n, nodes int, rv uint64) []*Object {
	objs := make([]*Object, n)
	for i := range objs {
		ns := fmt.Sprintf("team-%02d", i%20)
		name := fmt.Sprintf("app-%03d-5d8f7c6b9-%06d", i%200, i)
		o := &Object{Key: ns + "/" + name, RV: rv, Raw: []byte("{}"),
			Labels: map[string]string{"app": fmt.Sprintf("app-%03d", i%200)},
			Fields: map[string]string{"spec.nodeName": fmt.Sprintf("node-%04d", i%nodes), "status.phase": "Running"}}
		o.Namespace, o.Name = o.Key[:len(ns)], o.Key[len(ns)+1:]
		objs[i] = o
	}
	return objs
}

func benchPodStore(b *testing.B, n, nodes int, indexes []string) *Store {
	s, err := New(Options{Shards: 4, HistoryWindow: 150 * time.Second, Indexes: indexes})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Replace(benchPods(n, nodes, 1), 1); err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkListByNode is the store's part of a LIST by node
// (fieldSelector=spec.nodeName=<node>, no limit, as resourceVersion=0 and
// a consistent read without limit are): scan matches every pod; index
// walks the node's pods.
func BenchmarkListByNode(b *testing.B) {
	for _, size := range []struct{ pods, nodes int }{{10000, 500}, {50000, 2000}} {
		for _, indexed := range []bool{false, true} {
			mode := "scan"
			var indexes []string
			if indexed {
				mode, indexes = "index", []string{"spec.nodeName"}
			}
			b.Run(fmt.Sprintf("pods=%d/nodes=%d/%s", size.pods, size.nodes, mode), func(b *testing.B) {
				s := benchPodStore(b, size.pods, size.nodes, indexes)
				i := 0
				b.ReportAllocs()
				for b.Loop() {
					node := fmt.Sprintf("node-%04d", i%size.nodes)
					i++
					req := ListRequest{Match: func(o *Object) bool { return o.Fields["spec.nodeName"] == node }}
					if indexed {
						req.Index, req.ContinueByIndex = IndexValue{Field: "spec.nodeName", Value: node}, true
					}
					res, err := s.List(req)
					if err != nil {
						b.Fatal(err)
					}
					if len(res.Items) != size.pods/size.nodes {
						b.Fatalf("%d pods on %s", len(res.Items), node)
					}
				}
			})
		}
	}
}

// BenchmarkIndexBytesPerEntry reports the heap an index of spec.nodeName
// adds per pod: the same pods stored with and without the index, the live
// heap difference divided by the pods (heapB/entry: the B-tree, its
// strings shared with the objects); and the same after every pod was
// modified once with its node unchanged (updatedB/entry: the index now
// holds the key and value strings of the pods' earlier states, which the
// objects no longer share). No history is kept. One iteration is one run;
// use -benchtime=1x.
func BenchmarkIndexBytesPerEntry(b *testing.B) {
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	// Keys and values are fresh strings per state, as ingestion decodes
	// them.
	build := func(n int, indexes []string, update bool) (*Store, int64) {
		base := heap()
		s, err := New(Options{Shards: 4, Indexes: indexes})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Replace(benchPods(n, n/20, 1), 1); err != nil {
			b.Fatal(err)
		}
		if update {
			for i, o := range benchPods(n, n/20, 0) {
				o.RV = uint64(2 + i)
				if err := s.Apply(Event{Type: Modified, Object: o, RV: o.RV}); err != nil {
					b.Fatal(err)
				}
			}
		}
		return s, int64(heap() - base)
	}
	for _, n := range []int{10000, 100000} {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			for b.Loop() {
				for _, update := range []bool{false, true} {
					plain, without := build(n, nil, update)
					indexed, with := build(n, []string{"spec.nodeName"}, update)
					unit := "heapB/entry"
					if update {
						unit = "updatedB/entry"
					}
					b.ReportMetric(float64(with-without)/float64(n), unit)
					runtime.KeepAlive(plain)
					runtime.KeepAlive(indexed)
				}
			}
		})
	}
}

// BenchmarkApplyIndexed is ingestion's cost of the index: one Modified
// pod per op on 10k pods over 500 nodes, a state kept per event (150 s
// window), without an index, with one whose value the update keeps (most
// updates: status), and with one whose value changes (a pod scheduled).
func BenchmarkApplyIndexed(b *testing.B) {
	for _, mode := range []string{"none", "same-node", "new-node"} {
		b.Run(mode, func(b *testing.B) {
			var indexes []string
			if mode != "none" {
				indexes = []string{"spec.nodeName"}
			}
			s := benchPodStore(b, 10000, 500, indexes)
			pods := benchPods(10000, 500, 0)
			nodes := benchPods(10000, 499, 0) // other nodes for most pods
			rv := uint64(1)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				rv++
				src := pods[i%len(pods)]
				if mode == "new-node" && (i/len(pods))%2 == 0 {
					src = nodes[i%len(nodes)]
				}
				o := *src
				o.RV, o.Seq = rv, 0
				if err := s.Apply(Event{Type: Modified, Object: &o, RV: rv}); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
