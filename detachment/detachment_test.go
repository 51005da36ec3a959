package detachment

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestDetachTransitions(t *testing.T) {
	m := New(Config{Enabled: true, RecoverWindow: 3 * time.Second})
	if m.IsDetached() {
		t.Fatal("new machine is detached")
	}
	if !m.Detach(t0, ReasonLeaseDeadline, "") {
		t.Fatal("first Detach did not make the transition")
	}
	if m.Detach(t0.Add(time.Second), ReasonStorageError, "boom") {
		t.Fatal("second Detach reported a transition")
	}
	st := m.State()
	if !st.Detached || st.Reason != ReasonStorageError || st.Detail != "boom" || !st.Since.Equal(t0) {
		t.Fatalf("State() = %+v, want detached since t0 with the updated reason", st)
	}
}

func TestReattachAfterContinuousHealth(t *testing.T) {
	m := New(Config{Enabled: true, RecoverWindow: 3 * time.Second})
	m.Detach(t0, ReasonLeaseLost, "")
	if m.MaybeReattach(t0.Add(time.Hour)) {
		t.Fatal("re-attached without any healthy signal")
	}
	m.SignalHealthy(t0.Add(1 * time.Second))
	m.SignalHealthy(t0.Add(2 * time.Second)) // does not restart the window
	if at, ok := m.ReattachAt(); !ok || !at.Equal(t0.Add(4*time.Second)) {
		t.Fatalf("ReattachAt = %v, %v; want t0+4s", at, ok)
	}
	if m.MaybeReattach(t0.Add(3999 * time.Millisecond)) {
		t.Fatal("re-attached before the window elapsed")
	}
	if !m.MaybeReattach(t0.Add(4 * time.Second)) {
		t.Fatal("did not re-attach after the window")
	}
	if st := m.State(); st.Detached || st.Reason != ReasonNone {
		t.Fatalf("State after re-attach = %+v", st)
	}
	if m.MaybeReattach(t0.Add(5 * time.Second)) {
		t.Fatal("MaybeReattach while attached reported a transition")
	}
}

func TestUnhealthySignalResetsWindow(t *testing.T) {
	m := New(Config{Enabled: true, RecoverWindow: 3 * time.Second})
	m.Detach(t0, ReasonKeepAliveStreak, "")
	m.SignalHealthy(t0.Add(1 * time.Second))
	m.SignalUnhealthy(t0.Add(3 * time.Second))
	if m.MaybeReattach(t0.Add(5 * time.Second)) {
		t.Fatal("re-attached although the window was interrupted at t0+3s")
	}
	m.SignalHealthy(t0.Add(5 * time.Second))
	if m.MaybeReattach(t0.Add(7 * time.Second)) {
		t.Fatal("re-attached 2s into the new window")
	}
	if !m.MaybeReattach(t0.Add(8 * time.Second)) {
		t.Fatal("did not re-attach after a full new window")
	}
}

func TestDetachWhileDetachedRestartsWindow(t *testing.T) {
	m := New(Config{Enabled: true, RecoverWindow: 3 * time.Second})
	m.Detach(t0, ReasonLeaseDeadline, "")
	m.SignalHealthy(t0.Add(time.Second))
	m.Detach(t0.Add(2*time.Second), ReasonLeaseLost, "")
	if m.MaybeReattach(t0.Add(4 * time.Second)) {
		t.Fatal("re-attached with health that started before the last trip")
	}
}

func TestDisabledNeverDetaches(t *testing.T) {
	m := New(Config{Enabled: false, RecoverWindow: time.Second})
	if m.Detach(t0, ReasonLeaseDeadline, "") || m.IsDetached() {
		t.Fatal("disabled machine detached")
	}
	if m.Enabled() {
		t.Fatal("Enabled() = true")
	}
}

func TestPolicy(t *testing.T) {
	p := Policy{Margin: 5 * time.Second, FailureThreshold: 3}
	deadline := t0.Add(15 * time.Second)
	tests := []struct {
		now  time.Duration
		l    Lease
		want Reason
	}{
		{0, Lease{Deadline: deadline}, ReasonNone},
		{9999 * time.Millisecond, Lease{Deadline: deadline}, ReasonNone},
		{10 * time.Second, Lease{Deadline: deadline}, ReasonLeaseDeadline},
		{0, Lease{Deadline: deadline, FailureStreak: 2}, ReasonNone},
		{0, Lease{Deadline: deadline, FailureStreak: 3}, ReasonKeepAliveStreak},
		{0, Lease{Deadline: deadline, Lost: true}, ReasonLeaseLost},
		{20 * time.Second, Lease{Deadline: deadline, FailureStreak: 9, Lost: true}, ReasonLeaseLost},
	}
	for _, tc := range tests {
		if got := p.Evaluate(t0.Add(tc.now), tc.l); got != tc.want {
			t.Errorf("Evaluate(t0+%v, %+v) = %v, want %v", tc.now, tc.l, got, tc.want)
		}
	}
	if got := (Policy{Margin: time.Second}).Evaluate(t0, Lease{Deadline: deadline, FailureStreak: 100}); got != ReasonNone {
		t.Errorf("threshold 0 tripped on a streak: %v", got)
	}
}

func TestReasonStrings(t *testing.T) {
	for r := ReasonNone; r <= ReasonManual; r++ {
		if s := r.String(); s == "" || s == "unknown" {
			t.Errorf("Reason(%d).String() = %q", r, s)
		}
	}
	if Reason(99).String() != "unknown" {
		t.Error("out-of-range reason")
	}
}

// TestPauseBetweenSignalsRestartsWindow: a process paused between two
// healthy probes observed nothing in between, so the pause is not health:
// the window starts again at the first signal after it.
func TestPauseBetweenSignalsRestartsWindow(t *testing.T) {
	m := New(Config{Enabled: true, RecoverWindow: 3 * time.Second, MaxSignalGap: time.Second})
	m.Detach(t0, ReasonLeaseDeadline, "")
	m.SignalHealthy(t0.Add(500 * time.Millisecond))
	m.SignalHealthy(t0.Add(1100 * time.Millisecond))
	// Stopped for 9.6 s, then the next probe is healthy at once.
	resumed := t0.Add(10700 * time.Millisecond)
	m.SignalHealthy(resumed)
	if m.MaybeReattach(resumed.Add(5 * time.Millisecond)) {
		t.Fatal("re-attached 5ms after a 9.6s pause: the pause counted as health")
	}
	if at, ok := m.ReattachAt(); !ok || !at.Equal(resumed.Add(3*time.Second)) {
		t.Fatalf("ReattachAt = %v, %v; want the resume instant + 3s", at, ok)
	}
	for d := 500 * time.Millisecond; d < 3*time.Second; d += 500 * time.Millisecond {
		m.SignalHealthy(resumed.Add(d)) // regular probes keep the run going
	}
	if !m.MaybeReattach(resumed.Add(3 * time.Second)) {
		t.Fatal("did not re-attach after a full window of observed health")
	}
}
