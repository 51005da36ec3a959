package testenv

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Stalls: how long a process went without being scheduled. A goroutine
// sleeps StallTick again and again; a wake-up StallMin or more late means
// the process (or that goroutine) did not run for that long: the machine's
// other work, the Go scheduler or a GC pause held it. (An idle machine
// wakes a sleeper within a fraction of a millisecond; a CPU shared by two
// runnable processes hands it over every few milliseconds.)
// Real-time tests derive their bounds from the configured times plus the
// stall they measured, so that a bound missed by a starved process is told
// apart from a bound the code missed.
const (
	StallTick = 5 * time.Millisecond
	// StallMin is the smallest lateness counted: below it, a wake-up's
	// delay is timer and scheduler jitter. Smaller stalls are not counted,
	// so the measure errs on the side of too little starvation.
	StallMin = 5 * time.Millisecond
)

// ProbeStalls calls record for each stall of this process until ctx ends:
// end is when the late wake-up came, late how much later than StallTick it
// came; the stall spans [end-late, end].
func ProbeStalls(ctx context.Context, record func(end time.Time, late time.Duration)) {
	t := time.NewTimer(StallTick)
	defer t.Stop()
	prev := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		if late := now.Sub(prev) - StallTick; late >= StallMin {
			record(now, late)
		}
		prev = now
		t.Reset(StallTick)
	}
}

// StallProbe records this process's stalls while a test runs.
type StallProbe struct {
	mu     sync.Mutex
	stalls [][2]time.Time
}

// StartStallProbe runs a stall probe until t ends.
func StartStallProbe(t testing.TB) *StallProbe {
	p, stop := startStallProbe()
	t.Cleanup(stop)
	return p
}

// startStallProbe runs a stall probe until stop is called.
func startStallProbe() (p *StallProbe, stop func()) {
	p = &StallProbe{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ProbeStalls(ctx, func(end time.Time, late time.Duration) {
			p.mu.Lock()
			p.stalls = append(p.stalls, [2]time.Time{end.Add(-late), end})
			p.mu.Unlock()
		})
	}()
	return p, func() { cancel(); <-done }
}

// sharedProbe is one stall probe for every test that reports its failures
// (OnFailure), running while one of them runs.
var sharedProbe struct {
	sync.Mutex
	users int
	probe *StallProbe
	stop  func()
}

// useSharedProbe returns the shared probe, started if no test uses it;
// release ends this test's use (the last one stops it).
func useSharedProbe() (p *StallProbe, release func()) {
	sharedProbe.Lock()
	defer sharedProbe.Unlock()
	if sharedProbe.users == 0 {
		sharedProbe.probe, sharedProbe.stop = startStallProbe()
	}
	sharedProbe.users++
	p = sharedProbe.probe
	return p, func() {
		sharedProbe.Lock()
		defer sharedProbe.Unlock()
		if sharedProbe.users--; sharedProbe.users == 0 {
			sharedProbe.stop()
			sharedProbe.probe, sharedProbe.stop = nil, nil
		}
	}
}

// Longest returns the longest stall within [from, to] and when it ended.
func (p *StallProbe) Longest(from, to time.Time) (time.Duration, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var d time.Duration
	var at time.Time
	for _, s := range p.stalls {
		if lo, hi := later(s[0], from), earlier(s[1], to); hi.Sub(lo) > d {
			d, at = hi.Sub(lo), s[1]
		}
	}
	return d, at
}

// Within returns how long the process was measured unscheduled within
// [from, to].
func (p *StallProbe) Within(from, to time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var d time.Duration
	for _, s := range p.stalls {
		if lo, hi := later(s[0], from), earlier(s[1], to); hi.After(lo) {
			d += hi.Sub(lo)
		}
	}
	return d
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Patience bounds a test's wait for an event in real time by the time the
// waiting process was scheduled: d, plus every overrun of its own sleeps
// of StallMin or more (a process the machine did not run cannot see the
// event happen). In a synctest bubble its sleeps are virtual and never
// overrun: it is d.
type Patience struct {
	start   time.Time
	d       time.Duration
	stalled time.Duration
}

// NewPatience starts a wait of d scheduled time.
func NewPatience(d time.Duration) *Patience { return &Patience{start: time.Now(), d: d} }

// Sleep sleeps step, measuring its overrun.
func (p *Patience) Sleep(step time.Duration) {
	t0 := time.Now()
	time.Sleep(step)
	if late := time.Since(t0) - step; late >= StallMin {
		p.stalled += late
	}
}

// Over reports whether the wait has lasted d of scheduled time.
func (p *Patience) Over() bool { return time.Since(p.start) > p.d+p.stalled }

// String says how long the wait lasted, and how much of it the process was
// measured unscheduled: "10s (1.2s of it unscheduled)".
func (p *Patience) String() string {
	s := time.Since(p.start).Round(time.Millisecond).String()
	if p.stalled > 0 {
		s += fmt.Sprintf(" (%v of it unscheduled)", p.stalled.Round(time.Millisecond))
	}
	return s
}

// WaitFor polls cond every 10 ms until it holds, or fails t after d of
// scheduled time ([Patience]) saying what it waited for.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	p := NewPatience(d)
	for !cond() {
		if p.Over() {
			t.Fatalf("timed out after %v waiting for %s", p, what)
		}
		p.Sleep(10 * time.Millisecond)
	}
}
