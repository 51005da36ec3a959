package runner

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/detachment"
	"github.com/shardhost/shardhost/lease"
	"github.com/shardhost/shardhost/storage"
)

// detachInstant is the detach instant the admission checks compare the
// clock with (hosting's PastDetach): published by the watchdog at every
// lease health change, read lock-free on every handler's start and end.
type detachInstant struct {
	at      atomic.Int64      // ns since clockBase; MaxInt64: none; tripActed: acted on
	kick    chan struct{}     // 1-buffered: a caller saw the instant pass (the watchdog detaches)
	enabled bool              // detachment is on (Config.DisableDetachment)
	policy  detachment.Policy // the instant of a lease deadline (the watchdog's too)
}

func newDetachInstant(enabled bool, policy detachment.Policy) *detachInstant {
	d := &detachInstant{kick: make(chan struct{}, 1), enabled: enabled, policy: policy}
	d.at.Store(math.MaxInt64)
	return d
}

// tripActed marks the instant once a caller of past saw it pass: the
// hosting layer then refused a handler or withheld its result and
// discarded its instance, so the runner must detach even if a renewal
// lands meanwhile (otherwise it would keep the shard at the same epoch
// with that state silently lost). Every clock reads as past it.
const tripActed = math.MinInt64

// past reports whether the detach instant has passed; it then marks the
// instant acted on and wakes the watchdog, which detaches. A later instant
// published first (a renewal) wins the race: the caller sees it.
func (d *detachInstant) past() bool {
	for {
		at := d.at.Load()
		if at != tripActed {
			if time.Since(clockBase) < time.Duration(at) {
				return false
			}
			if !d.at.CompareAndSwap(at, tripActed) {
				continue // a renewal published a later instant, or another caller marked it
			}
		}
		signal(d.kick)
		return true
	}
}

// acted reports whether a caller acted on the passing of the published
// detach instant; the watchdog then detaches, whatever the lease's health
// says now.
func (d *detachInstant) acted() bool { return d.at.Load() == tripActed }

// set publishes the detach instant of the lease health h (none while
// detachment is disabled), unless a caller already acted on the passing
// of the instant published before: that one stands until the runner
// detaches (reset at the next attachment).
func (d *detachInstant) set(h lease.Health) {
	next := d.instantOf(h)
	for {
		at := d.at.Load()
		if at == tripActed || d.at.CompareAndSwap(at, next) {
			return
		}
	}
}

// reset publishes the detach instant of a new attachment's lease health h,
// replacing any instant acted on under the attachment before.
func (d *detachInstant) reset(h lease.Health) { d.at.Store(d.instantOf(h)) }

func (d *detachInstant) instantOf(h lease.Health) int64 {
	if !d.enabled || h.Lease == storage.NoLease {
		return math.MaxInt64
	}
	return int64(d.policy.TripAt(h.Deadline).Sub(clockBase))
}
