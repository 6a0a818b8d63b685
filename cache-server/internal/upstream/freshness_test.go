package upstream

import "testing"

// A late bookmark on one probe must not turn a watch-cached resource into
// one that is re-read on every quiet consistent read.
func TestBookmarklessAfter(t *testing.T) {
	for _, tt := range []struct {
		sawBookmark bool
		misses      int32
		want        bool
	}{
		{false, 1, false},
		{false, probeMissesForBookmarkless - 1, false},
		{false, probeMissesForBookmarkless, true},
		{false, probeMissesForBookmarkless + 5, true},
		{true, 1, false},
		{true, probeMissesForBookmarkless, false},
		{true, 100, false},
	} {
		if got := bookmarklessAfter(tt.sawBookmark, tt.misses); got != tt.want {
			t.Errorf("bookmarklessAfter(sawBookmark=%v, misses=%d) = %v, want %v", tt.sawBookmark, tt.misses, got, tt.want)
		}
	}
}
