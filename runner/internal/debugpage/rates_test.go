package debugpage

import (
	"testing"
	"time"
)

// TestRateSampler: rates are counter deltas over the interval between two
// samples at least rateInterval apart; samples in between reuse them.
func TestRateSampler(t *testing.T) {
	var s rateSampler
	t0 := time.Unix(1000, 0)
	if got := s.update(t0, map[string]uint64{"total": 100}); got != nil {
		t.Fatalf("first sample gave rates %v, want none", got)
	}
	if got := s.update(t0.Add(500*time.Millisecond), map[string]uint64{"total": 400}); got != nil {
		t.Fatalf("sample after 0.5 s gave rates %v, want none yet", got)
	}
	got := s.update(t0.Add(2*time.Second), map[string]uint64{"total": 700, "kind:a": 5})
	if got["total"] != 300 || len(got) != 1 {
		t.Fatalf("rates after 2 s = %v, want total 300/s only (kind:a has no earlier sample)", got)
	}
	if again := s.update(t0.Add(2500*time.Millisecond), map[string]uint64{"total": 9999}); again["total"] != 300 {
		t.Errorf("sample 0.5 s later gave %v, want the last rates", again)
	}
	got = s.update(t0.Add(4*time.Second), map[string]uint64{"total": 700, "kind:a": 25})
	if got["total"] != 0 || got["kind:a"] != 10 {
		t.Errorf("rates = %v, want total 0/s, kind:a 10/s", got)
	}
}
