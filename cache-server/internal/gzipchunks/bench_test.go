package gzipchunks

import (
	"bufio"
	"io"
	"testing"

	"github.com/klauspost/compress/gzip"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// The body of a 10k x 1 KiB ConfigMap LIST (hack/bench's small set) three
// ways: compressed whole as before this package (klauspost gzip level 1
// behind a 64 KiB buffer), with every chunk compressed and kept (the first
// LIST, or one after every object changed), and from kept chunks.
func benchItems(b *testing.B) []*store.Object {
	st, _ := newStore(b, 10000, 1024, xs)
	return listItems(b, st, store.ListRequest{})
}

const benchHead = `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[`

func BenchmarkWhole10kx1KiB(b *testing.B) {
	items := benchItems(b)
	gw, _ := gzip.NewWriterLevel(io.Discard, gzip.BestSpeed)
	bw := bufio.NewWriterSize(gw, 64<<10)
	b.SetBytes(int64(len(plain(benchHead, items, `]}`))))
	for b.Loop() {
		gw.Reset(io.Discard)
		bw.Reset(gw)
		_, _ = bw.WriteString(benchHead)
		for i, o := range items {
			if i > 0 {
				_ = bw.WriteByte(',')
			}
			_, _ = bw.Write(o.Raw)
		}
		_, _ = bw.WriteString(`]}`)
		_ = bw.Flush()
		_ = gw.Close()
	}
}

func benchChunks(b *testing.B, warm bool) {
	items := benchItems(b)
	c := New(0, newMetrics())
	s := c.Scope("configmaps")
	out := bufio.NewWriterSize(io.Discard, 64<<10)
	write := func() {
		w := s.NewWriter(out)
		_, _ = w.Write([]byte(benchHead))
		w.Items(items, writeItem)
		_, _ = w.Write([]byte(`]}`))
		_ = w.Close()
		_ = out.Flush()
	}
	write()
	b.SetBytes(int64(len(plain(benchHead, items, `]}`))))
	for b.Loop() {
		if !warm {
			b.StopTimer()
			c = New(0, newMetrics())
			s = c.Scope("configmaps")
			b.StartTimer()
		}
		write()
	}
}

func BenchmarkChunksCold10kx1KiB(b *testing.B) { benchChunks(b, false) }
func BenchmarkChunksWarm10kx1KiB(b *testing.B) { benchChunks(b, true) }
