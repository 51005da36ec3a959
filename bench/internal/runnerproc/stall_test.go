package runnerproc

import (
	"testing"
	"time"
)

func TestStallsWithinCountsOnlyTheOverlap(t *testing.T) {
	ms := int64(time.Millisecond)
	s := StallsOf([]Record{
		{Kind: HistStall, PID: 1, Mono: 100 * ms, Value: 30 * ms}, // [70, 100] ms
		{Kind: HistStart, PID: 1, Mono: 150 * ms},
		{Kind: HistStall, PID: 1, Mono: 300 * ms, Value: 100 * ms}, // [200, 300] ms
		{Kind: HistStall, PID: 2, Mono: 90 * ms, Value: 50 * ms},
	})
	if len(s) != 2 || len(s[1]) != 2 || len(s[2]) != 1 {
		t.Fatalf("StallsOf = %v, want 2 stalls of pid 1 and 1 of pid 2", s)
	}
	for _, tc := range []struct {
		from, to int64
		want     time.Duration
	}{
		{0, 1000 * ms, 130 * time.Millisecond},
		{80 * ms, 250 * ms, 70 * time.Millisecond},
		{100 * ms, 200 * ms, 0},
		{250 * ms, 260 * ms, 10 * time.Millisecond},
	} {
		if got := s[1].Within(tc.from, tc.to); got != tc.want {
			t.Errorf("Within(%v, %v) = %v, want %v", time.Duration(tc.from), time.Duration(tc.to), got, tc.want)
		}
	}
}
