package store

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
)

func obj(ns, name string, rv uint64) *Object {
	return &Object{
		Key: keyhash.Key(ns, name), Namespace: ns, Name: name, RV: rv,
		Raw: []byte(`{"metadata":{"name":"` + name + `","resourceVersion":"` + itoa(rv) + `"}}`),
	}
}

func itoa(v uint64) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for ; v > 0; v /= 10 {
		i--
		b[i] = byte('0' + v%10)
	}
	return string(b[i:])
}

func mustApply(t testing.TB, s interface{ Apply(Event) error }, typ EventType, o *Object) {
	t.Helper()
	if err := s.Apply(Event{Type: typ, Object: o, RV: o.RV}); err != nil {
		t.Fatalf("Apply %s %s@%d: %v", typ, o.Key, o.RV, err)
	}
}

func keys(s Snapshot) []string {
	var out []string
	s.Range("", "", func(o *Object) bool { out = append(out, o.Key+"@"+itoa(o.RV)); return true })
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestShardApplyAndSnapshots(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	s := NewShard(ShardOptions{HistoryWindow: time.Minute, Clock: clk})

	mustApply(t, s, Added, obj("ns", "a", 10))
	mustApply(t, s, Added, obj("ns", "b", 11))
	s.MarkProgress(15)
	mustApply(t, s, Modified, obj("ns", "a", 20))
	mustApply(t, s, Deleted, obj("ns", "b", 21))
	// Deleting something absent only moves the RV.
	mustApply(t, s, Deleted, obj("ns", "zz", 22))

	if got := s.AppliedRV(); got != 22 {
		t.Fatalf("AppliedRV = %d", got)
	}
	cases := []struct {
		rv   uint64
		want []string
	}{
		{0, nil},
		{9, nil},
		{10, []string{"ns/a@10"}},
		{11, []string{"ns/a@10", "ns/b@11"}},
		{15, []string{"ns/a@10", "ns/b@11"}}, // progress only: same state as 11
		{19, []string{"ns/a@10", "ns/b@11"}},
		{20, []string{"ns/a@20", "ns/b@11"}},
		{21, []string{"ns/a@20"}},
		{22, []string{"ns/a@20"}},
	}
	for _, c := range cases {
		snap, err := s.Snapshot(c.rv)
		if err != nil {
			t.Fatalf("Snapshot(%d): %v", c.rv, err)
		}
		if snap.RV() != c.rv {
			t.Errorf("Snapshot(%d).RV() = %d", c.rv, snap.RV())
		}
		if got := keys(snap); !equal(got, c.want) {
			t.Errorf("Snapshot(%d) = %v, want %v", c.rv, got, c.want)
		}
	}
	if l := s.Latest(); l.RV() != 22 || !equal(keys(l), []string{"ns/a@20"}) {
		t.Errorf("Latest = %d %v", l.RV(), keys(l))
	}

	// A future RV is not an "expired" answer but "too large".
	_, err := s.Snapshot(23)
	var tl *TooLargeResourceVersionError
	if !errors.As(err, &tl) || tl.RV != 23 || tl.Current != 22 {
		t.Fatalf("Snapshot(23) err = %#v", err)
	}

	// Stale and malformed events are refused and change nothing.
	if err := s.Apply(Event{Type: Modified, Object: obj("ns", "a", 22), RV: 22}); !errors.Is(err, ErrStaleEvent) {
		t.Fatalf("stale Apply err = %v", err)
	}
	if err := s.Apply(Event{Type: Added, RV: 30}); err == nil {
		t.Fatal("Apply without object must fail")
	}
	if err := s.Apply(Event{Type: EventType(9), Object: obj("ns", "x", 30), RV: 30}); err == nil {
		t.Fatal("Apply with unknown type must fail")
	}
	st := s.Stats()
	if st.Objects != 1 || st.Bytes != int64(len(obj("ns", "a", 20).Raw)) || st.AppliedRV != 22 {
		t.Errorf("Stats = %+v", st)
	}
}

// TestShardHistoryWindow checks that a state stays readable for the window
// measured from when it was superseded, then turns into a 410.
func TestShardHistoryWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	clk := clocktesting.NewFakePassiveClock(t0)
	s := NewShard(ShardOptions{HistoryWindow: time.Minute, Clock: clk})
	mustApply(t, s, Added, obj("ns", "a", 10))

	// The only state is current: it never expires, however old.
	clk.SetTime(t0.Add(time.Hour))
	if _, err := s.Snapshot(10); err != nil {
		t.Fatalf("current state expired: %v", err)
	}
	mustApply(t, s, Modified, obj("ns", "a", 20)) // state@10 superseded at t0+1h
	clk.SetTime(t0.Add(time.Hour + time.Minute))
	if _, err := s.Snapshot(15); err != nil {
		t.Fatalf("state within window: %v", err)
	}
	clk.SetTime(t0.Add(time.Hour + time.Minute + time.Second))
	_, err := s.Snapshot(15)
	var exp *ExpiredError
	if !errors.As(err, &exp) || exp.RV != 15 || exp.Oldest != 20 {
		t.Fatalf("Snapshot(15) after window: %#v", err)
	}
	if !apierrors.IsResourceExpired(err) {
		t.Fatalf("expired error is not a 410 Expired API status: %v", err)
	}
	st := err.(apierrors.APIStatus).Status()
	if st.Code != http.StatusGone || st.Message != "The resourceVersion for the provided list is too old." {
		t.Fatalf("status = %+v", st)
	}
	if _, err := s.Snapshot(20); err != nil {
		t.Fatalf("Snapshot(20): %v", err)
	}
}

func TestShardMaxHistory(t *testing.T) {
	s := NewShard(ShardOptions{HistoryWindow: time.Hour, MaxHistory: 3, Clock: clocktesting.NewFakePassiveClock(time.Unix(0, 0))})
	for rv := uint64(1); rv <= 10; rv++ {
		mustApply(t, s, Added, obj("ns", "o"+itoa(rv), rv))
	}
	if n := s.Stats().Snapshots; n != 3 {
		t.Fatalf("Snapshots = %d, want 3", n)
	}
	if _, err := s.Snapshot(8); err != nil {
		t.Fatalf("Snapshot(8): %v", err)
	}
	if _, err := s.Snapshot(7); !apierrors.IsResourceExpired(err) {
		t.Fatalf("Snapshot(7) err = %v", err)
	}
}

// TestSnapshotIsolation checks that a snapshot taken earlier is unaffected by
// later writes to the live tree (the copy-on-write contract).
func TestSnapshotIsolation(t *testing.T) {
	s := NewShard(ShardOptions{HistoryWindow: time.Hour})
	for i := uint64(1); i <= 500; i++ {
		mustApply(t, s, Added, obj("ns", "o"+itoa(i), i))
	}
	before := s.Latest()
	want := keys(before)
	for i := uint64(1); i <= 500; i++ {
		if i%2 == 0 {
			mustApply(t, s, Deleted, obj("ns", "o"+itoa(i), 500+i))
		} else {
			mustApply(t, s, Modified, obj("ns", "o"+itoa(i), 500+i))
		}
	}
	if got := keys(before); !equal(got, want) {
		t.Fatal("old snapshot changed after writes")
	}
	if before.Len() != 500 || s.Latest().Len() != 250 {
		t.Fatalf("Len before=%d after=%d", before.Len(), s.Latest().Len())
	}
}

func TestShardWaitForRV(t *testing.T) {
	s := NewShard(ShardOptions{})
	done := make(chan error, 1)
	go func() { done <- s.WaitForRV(context.Background(), 5) }()
	select {
	case err := <-done:
		t.Fatalf("WaitForRV returned early: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	s.MarkProgress(4)
	select {
	case err := <-done:
		t.Fatalf("WaitForRV returned at RV 4: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	mustApply(t, s, Added, obj("ns", "a", 5))
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitForRV not woken by Apply")
	}
	// Already there: returns at once.
	if err := s.WaitForRV(context.Background(), 3); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := s.WaitForRV(ctx, 100)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	st := err.(apierrors.APIStatus).Status()
	if st.Code != http.StatusGatewayTimeout || st.Reason != metav1.StatusReasonTimeout ||
		st.Message != "Timeout: Too large resource version: 100, current: 5" ||
		st.Details.RetryAfterSeconds != 1 || len(st.Details.Causes) != 1 ||
		st.Details.Causes[0].Type != metav1.CauseTypeResourceVersionTooLarge {
		t.Fatalf("status = %+v", st)
	}
	if !apierrors.IsTimeout(err) || !apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
		t.Fatal("apierrors helpers do not recognise the too-large error")
	}
}

func TestShardReplace(t *testing.T) {
	s := NewShard(ShardOptions{HistoryWindow: time.Hour})
	mustApply(t, s, Added, obj("ns", "keep", 1))
	mustApply(t, s, Added, obj("ns", "change", 2))
	mustApply(t, s, Added, obj("ns", "gone", 3))
	mustApply(t, s, Added, obj("ns", "z-gone", 4))

	evs, err := s.Replace([]*Object{obj("ns", "new", 9), obj("ns", "change", 8), obj("ns", "keep", 1), obj("ns", "a-new", 7)}, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		if e.RV != 10 {
			t.Errorf("event RV %d", e.RV)
		}
		got = append(got, e.Type.String()+" "+e.Object.Key)
	}
	want := []string{"ADDED ns/a-new", "MODIFIED ns/change", "DELETED ns/gone", "ADDED ns/new", "DELETED ns/z-gone"}
	if !equal(got, want) {
		t.Fatalf("events = %v, want %v", got, want)
	}
	if s.AppliedRV() != 10 || !equal(keys(s.Latest()), []string{"ns/a-new@7", "ns/change@8", "ns/keep@1", "ns/new@9"}) {
		t.Fatalf("after replace: %d %v", s.AppliedRV(), keys(s.Latest()))
	}
	// States up to the old applied RV stay readable (continue tokens issued
	// before the relist keep working); the gap up to the relist's RV was
	// never observed and reads as expired.
	if snap, err := s.Snapshot(4); err != nil || !equal(keys(snap), []string{"ns/change@2", "ns/gone@3", "ns/keep@1", "ns/z-gone@4"}) {
		t.Fatalf("Snapshot(4) after Replace = %v, %v", keys(snap), err)
	}
	for _, rv := range []uint64{5, 9} {
		if _, err := s.Snapshot(rv); !apierrors.IsResourceExpired(err) {
			t.Fatalf("Snapshot(%d) inside the relist gap: err = %v", rv, err)
		}
	}
	if snap, err := s.Snapshot(10); err != nil || len(keys(snap)) != 4 {
		t.Fatalf("Snapshot(10) = %v, %v", keys(snap), err)
	}
	if st := s.Stats(); st.Objects != 4 || st.Snapshots != 6 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := s.Replace(nil, 9); !errors.Is(err, ErrStaleEvent) {
		t.Fatalf("replace into the past: %v", err)
	}
	if _, err := s.Replace([]*Object{obj("ns", "a", 1), obj("ns", "a", 2)}, 11); err == nil {
		t.Fatal("duplicate keys must fail")
	}
	// An identical relist produces no events and no gap: the state at 10
	// is the state at every RV up to the relist's.
	evs, err = s.Replace([]*Object{obj("ns", "new", 9), obj("ns", "change", 8), obj("ns", "keep", 1), obj("ns", "a-new", 7)}, 12)
	if err != nil || len(evs) != 0 {
		t.Fatalf("identical relist: %v %v", evs, err)
	}
	if snap, err := s.Snapshot(11); err != nil || len(keys(snap)) != 4 || s.AppliedRV() != 12 {
		t.Fatalf("Snapshot(11) after an identical relist = %v, %v (applied %d)", keys(snap), err, s.AppliedRV())
	}
}

// TestFirstLoadIsTheOldestState: before its first load a shard holds no
// state of upstream's; a read at an RV between 0 and the load's is
// expired, not the empty tree it started with (a restarted replica
// answered such a read with nothing). Also when the load is empty.
func TestFirstLoadIsTheOldestState(t *testing.T) {
	for _, objs := range [][]*Object{{obj("ns", "a", 5), obj("ns", "b", 7)}, nil} {
		s := NewShard(ShardOptions{HistoryWindow: time.Hour})
		if _, err := s.Replace(objs, 10); err != nil {
			t.Fatal(err)
		}
		for _, rv := range []uint64{1, 5, 9} {
			var expired *ExpiredError
			if _, err := s.Snapshot(rv); !errors.As(err, &expired) || expired.Oldest != 10 {
				t.Errorf("%d objects loaded at 10: Snapshot(%d) = %v, want expired (oldest 10)", len(objs), rv, err)
			}
		}
		snap, err := s.Snapshot(10)
		if err != nil || snap.Len() != len(objs) {
			t.Errorf("Snapshot(10): %v, %v; want %d objects", snap.Len(), err, len(objs))
		}
		if st := s.Stats(); st.OldestRV != 10 {
			t.Errorf("oldest readable RV %d, want 10", st.OldestRV)
		}
	}
}
