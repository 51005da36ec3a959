package runnerproc

import (
	"context"
	"time"
)

// Stall probe: how long a process went without being scheduled. A
// goroutine sleeps StallTick again and again; a wake-up later than
// StallTick + StallMin means the process (or that goroutine) did not run
// for that long: the machine's other work, the Go scheduler or a GC pause
// held it. Checkers of timing rules use it to tell a bound missed by a
// starved process from a bound the code missed.
const (
	StallTick = 10 * time.Millisecond
	// StallMin is the smallest lateness recorded: below it, a wake-up's
	// delay is timer and scheduler jitter. Smaller stalls are not counted,
	// so the measure errs on the side of too little starvation.
	StallMin = 20 * time.Millisecond
)

// ProbeStalls calls record for each stall of this process until ctx ends:
// end is when the late wake-up came (CLOCK_MONOTONIC, [Mono]), late how
// much later than StallTick it came. A stall spans [end-late, end].
func ProbeStalls(ctx context.Context, record func(end, late int64)) {
	t := time.NewTimer(StallTick)
	defer t.Stop()
	prev := Mono()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := Mono()
		if late := now - prev - int64(StallTick); late >= int64(StallMin) {
			record(now, late)
		}
		prev = now
		t.Reset(StallTick)
	}
}

// Stalls are a process's stalls, as [ProbeStalls] recorded them: intervals
// [from, to] of CLOCK_MONOTONIC, in time order.
type Stalls [][2]int64

// Within returns how long the stalls overlap [from, to].
func (s Stalls) Within(from, to int64) time.Duration {
	var d int64
	for _, iv := range s {
		if lo, hi := max(iv[0], from), min(iv[1], to); hi > lo {
			d += hi - lo
		}
	}
	return time.Duration(d)
}

// StallsOf returns the stalls a history records (HistStall), by process.
func StallsOf(recs []Record) map[int]Stalls {
	out := map[int]Stalls{}
	for _, r := range recs {
		if r.Kind == HistStall {
			out[r.PID] = append(out[r.PID], [2]int64{r.Mono - r.Value, r.Mono})
		}
	}
	return out
}
