package tables

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// A LIST's Table written in pieces.
//
// The Table of a 10k-object LIST is tens of MB of rows (the whole objects
// with includeObject=Object); built whole, every such request holds its
// decoded objects, its rows and its marshalled body at once. A List writes
// the same bytes a batch of rows at a time: the head (kind, apiVersion,
// metadata, columnDefinitions), each row's JSON, the tail. encoding/json
// writes a slice as its elements' encodings joined by commas, so rows
// marshalled one by one with the same encoder settings give exactly the
// bytes of the whole Table (TestListMatchesTable proves it over real
// objects and every includeObject).
//
// That holds only for printers whose rows are a function of their own
// object: the apiserver's list printers call the object printer for each
// item in order, except the two in acrossItems.

// ListBatch is how many objects a List converts at once: the printers'
// per-call cost (a list object, its accessors) is shared by a batch, and a
// batch's decoded objects and rows are all a request holds.
const ListBatch = 64

// acrossItems are the built-in resources whose list printer
// (k8s.io/kubernetes/pkg/printers/internalversion, 1.37.1) reads across
// items, so their rows cannot be printed a batch at a time: FlowSchemas
// are sorted by matching precedence (printFlowSchemaList), and a
// StorageClass's "(default)" depends on the other StorageClasses
// (printStorageClassList, getEffectiveDefaultStorageClass). Both are a
// cluster's configuration — a few dozen objects — so building their Table
// whole costs nothing.
var acrossItems = map[schema.GroupResource]bool{
	{Group: "flowcontrol.apiserver.k8s.io", Resource: "flowschemas"}: true,
	{Group: "storage.k8s.io", Resource: "storageclasses"}:            true,
}

// List writes the Table of one LIST: Head, then WriteRows for consecutive
// batches of its items in order, then Tail. It uses one set of columns
// throughout (a custom resource's printer is taken once).
type List struct {
	table   func(items [][]byte, meta metav1.ListMeta) (*metav1.Table, error)
	meta    metav1.ListMeta
	head    []byte
	written int
}

// tail ends the Table after its last row.
const tail = "]}"

// NewList starts the Table of a LIST with meta from p, or returns false
// when p's rows depend on each other (acrossItems): that Table must be
// built whole (Printer.Table). An error is the error of the Table of no
// items.
func NewList(p Printer, meta metav1.ListMeta, opts Options) (*List, bool, error) {
	var table func(items [][]byte, meta metav1.ListMeta) (*metav1.Table, error)
	switch p := p.(type) {
	case *builtin:
		if acrossItems[p.gr] {
			return nil, false, nil
		}
		table = func(items [][]byte, meta metav1.ListMeta) (*metav1.Table, error) {
			return p.Table(items, true, meta, opts)
		}
	case *generic:
		table = func(items [][]byte, meta metav1.ListMeta) (*metav1.Table, error) {
			return p.Table(items, true, meta, opts)
		}
	case *Custom:
		// Taken once: the head and every row use the same columns even
		// if the CRD's printer columns change during the LIST.
		c := *p.c.Load()
		table = func(items [][]byte, meta metav1.ListMeta) (*metav1.Table, error) {
			return unstructuredTable(p.gr, c, items, true, meta, opts)
		}
	default:
		return nil, false, nil
	}
	l := &List{table: table, meta: meta}
	head, err := l.HeadFor(meta)
	if err != nil {
		return nil, true, err
	}
	l.head = head
	return l, true, nil
}

// Head is the Table up to its first row.
func (l *List) Head() []byte { return l.head }

// HeadFor is the head of the same Table (its columns) with other list
// metadata: a page whose continue token and remaining count are known
// only after its rows were written (a fleet front's paged LIST) writes
// its rows first and asks for its head after. The head is the Table of
// no items up to its rows: the columns and metadata do not depend on the
// rows, nor the rows on the metadata.
func (l *List) HeadFor(meta metav1.ListMeta) ([]byte, error) {
	t, err := l.table(nil, meta)
	if err != nil {
		return nil, err
	}
	t.Rows = []metav1.TableRow{}
	b, err := json.Marshal(t)
	if err != nil {
		return nil, err
	}
	if !bytes.HasSuffix(b, []byte(`"rows":[]}`)) {
		return nil, fmt.Errorf("tables: unexpected Table encoding %q", b[max(len(b)-32, 0):])
	}
	return b[:len(b)-len(tail)], nil
}

// WriteRows writes the rows of items (at most ListBatch at a time keeps
// the memory bound), each after a comma unless it is the Table's first.
// Write errors are w's to keep (a response writer drops them); an error
// returned is a conversion's, possibly after some rows were written.
func (l *List) WriteRows(w io.Writer, items [][]byte) error {
	t, err := l.table(items, l.meta)
	if err != nil {
		return err
	}
	for i := range t.Rows {
		// By pointer, as an element of the whole Table's slice is
		// addressable: the same methods apply.
		b, err := json.Marshal(&t.Rows[i])
		if err != nil {
			return err
		}
		if l.written > 0 {
			_, _ = w.Write([]byte{','})
		}
		l.written++
		_, _ = w.Write(b)
	}
	return nil
}

// Tail ends the Table after its last row.
func (l *List) Tail() []byte { return []byte(tail) }
