package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Fault kinds.
const (
	faultKill        = "kill"         // SIGKILL a runner; restart it with the same ID after Hold
	faultPause       = "pause"        // SIGSTOP a runner for Hold (> TTL), then SIGCONT
	faultBlackhole   = "blackhole"    // toxiproxy timeout on all of a runner's etcd links for Hold (> TTL)
	faultLatency     = "latency"      // latency > TTL on all of a runner's etcd links for Hold
	faultReset       = "reset"        // reset_peer on all of a runner's etcd links for Hold
	faultLeaderKill  = "leader-kill"  // SIGKILL the etcd leader; restart it after Hold
	faultLeaderPause = "leader-pause" // SIGSTOP the etcd leader for Hold (< TTL), then SIGCONT
	faultGraceful    = "graceful"     // SIGTERM a runner (Shutdown); restart it after Hold
	faultScaleUp     = "scale-up"     // start one more runner
)

var faultKinds = []string{faultKill, faultPause, faultBlackhole, faultLatency, faultReset,
	faultLeaderKill, faultLeaderPause, faultGraceful, faultScaleUp}

// onRunner reports whether a fault kind targets one runner.
func onRunner(kind string) bool {
	switch kind {
	case faultLeaderKill, faultLeaderPause, faultScaleUp:
		return false
	}
	return true
}

// fault is one step of a schedule.
type fault struct {
	Kind   string
	Target string        // runner ID for runner faults; the new runner's ID for scale-up
	Hold   time.Duration // how long the fault lasts before it is healed
	Gap    time.Duration // quiet time after the heal, before the next fault
}

func (f fault) String() string {
	switch {
	case f.Kind == faultScaleUp:
		return fmt.Sprintf("%s +%s", f.Kind, f.Target)
	case f.Target != "":
		return fmt.Sprintf("%s %s %v", f.Kind, f.Target, f.Hold.Round(10*time.Millisecond))
	default:
		return fmt.Sprintf("%s %v", f.Kind, f.Hold.Round(10*time.Millisecond))
	}
}

// schedule draws n faults for seed: the same seed and parameters give the
// same schedule. Runner faults pick among the runners running at that
// point; a scale-up adds a runner that later faults may pick.
func schedule(seed uint64, n int, p params) []fault {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ttl := p.TTL
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	ids := make([]string, p.Runners)
	for i := range ids {
		ids[i] = runnerID(i + 1)
	}
	kinds := p.Kinds
	if len(kinds) == 0 {
		kinds = faultKinds
	}
	var out []fault
	for range n {
		f := fault{Kind: kinds[rng.IntN(len(kinds))], Gap: between(time.Second, 3*time.Second)}
		if f.Kind == faultScaleUp && len(ids) >= p.Runners+2 {
			f.Kind = faultKill // at most two runners more than at the start
		}
		if onRunner(f.Kind) {
			f.Target = ids[rng.IntN(len(ids))]
		}
		switch f.Kind {
		case faultKill, faultGraceful:
			f.Hold = between(200*time.Millisecond, 2*time.Second)
		case faultPause:
			f.Hold = ttl + between(time.Second, 4*time.Second)
		case faultBlackhole:
			f.Hold = ttl + between(time.Second, 3*time.Second)
		case faultLatency:
			f.Hold = between(3*time.Second, 6*time.Second)
		case faultReset:
			f.Hold = between(time.Second, 4*time.Second)
		case faultLeaderKill:
			f.Hold = between(time.Second, 3*time.Second)
		case faultLeaderPause:
			f.Hold = between(time.Second, 3*time.Second)
		case faultScaleUp:
			f.Target = runnerID(len(ids) + 1)
			ids = append(ids, f.Target)
		}
		out = append(out, f)
	}
	return out
}

func runnerID(i int) string { return fmt.Sprintf("r%d", i) }

func scheduleString(fs []fault) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = f.String()
	}
	return strings.Join(parts, "; ")
}
