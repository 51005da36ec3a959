package testenv

import (
	"testing"
	"testing/synctest"
	"time"
)

func TestStallProbeWithinCountsOnlyTheOverlap(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	p := &StallProbe{stalls: [][2]time.Time{{at(70), at(100)}, {at(200), at(300)}}}
	for _, tc := range []struct {
		from, to int
		want     time.Duration
	}{
		{0, 1000, 130 * time.Millisecond},
		{80, 250, 70 * time.Millisecond},
		{100, 200, 0},
		{250, 260, 10 * time.Millisecond},
	} {
		if got := p.Within(at(tc.from), at(tc.to)); got != tc.want {
			t.Errorf("Within(%d ms, %d ms) = %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}

// TestPatienceAddsTheMeasuredStallToItsBound: a wait's bound is d of the
// time the process was scheduled; in a synctest bubble nothing overruns,
// so it is d exactly.
func TestPatienceAddsTheMeasuredStallToItsBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPatience(time.Second)
		for range 100 {
			p.Sleep(10 * time.Millisecond)
		}
		if p.Over() {
			t.Fatalf("over after exactly its bound (%v)", p)
		}
		p.Sleep(10 * time.Millisecond)
		if !p.Over() {
			t.Fatalf("not over after its bound (%v)", p)
		}
		p.stalled = 500 * time.Millisecond // measured unscheduled
		if p.Over() {
			t.Fatalf("over although 0.5 s of the 1.01 s were unscheduled (%v)", p)
		}
		time.Sleep(500 * time.Millisecond)
		if !p.Over() {
			t.Fatalf("not over after its bound plus the stall (%v)", p)
		}
	})
}
