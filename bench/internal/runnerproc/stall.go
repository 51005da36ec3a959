package runnerproc

import "time"

// Stalls are a process's stalls, as its probe (testenv.ProbeStalls)
// recorded them in its history (HistStall): intervals [from, to] of
// CLOCK_MONOTONIC, in time order.
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
