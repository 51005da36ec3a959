package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// TestDemo runs the whole demo on an embedded etcd with short phases and
// checks its verdict. No goleak here: the embedded etcd server leaves
// goroutines behind after Close.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd and waits for a lease to expire")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	var out bytes.Buffer
	s, err := run(ctx, options{duration: time.Second, counters: 100, workers: 4, out: &out, logs: io.Discard})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if len(s.Problems) > 0 {
		t.Errorf("problems: %q", s.Problems)
	}
	if len(s.Phases) != 3 {
		t.Fatalf("%d phases, want 3", len(s.Phases))
	}
	for _, p := range s.Phases {
		if p.Traffic.OK == 0 {
			t.Errorf("phase %s: no acknowledged asks", p.Name)
		}
	}
	if s.OnCrashed == 0 {
		t.Errorf("no counter on runner-3 at the crash")
	}
	crash := s.Phases[2].Check
	if crash.Lost > s.OnCrashed || crash.LostOn["runner-3"] != crash.Lost {
		t.Errorf("crash phase: %d counters lost increments, %d of them on runner-3, which hosted %d", crash.Lost, crash.LostOn["runner-3"], s.OnCrashed)
	}
	if s.Takeover <= 0 || s.Takeover > 2*leaseTTL {
		t.Errorf("takeover after %v, want within 2 lease TTLs (%v)", s.Takeover, 2*leaseTTL)
	}
	if !strings.Contains(out.String(), "OK:") {
		t.Errorf("summary has no OK verdict")
	}
}
