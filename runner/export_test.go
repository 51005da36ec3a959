package runner

import (
	"sync"
	"sync/atomic"

	"github.com/shardhost/shardhost/transport"
)

// ParkedForTest returns how many requests wait parked here (park.go).
func (r *Runner) ParkedForTest() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.parked.total
}

// HoldViewsForTest makes this runner's lock and runner watches wait,
// before they apply their next update, until release is called: its views
// lag behind the store's (and other runners').
func (r *Runner) HoldViewsForTest() (release func()) {
	locks, runners := hold(&r.lockHold), hold(&r.runnersHold)
	return func() { locks(); runners() }
}

// HoldLockWatchForTest is HoldViewsForTest for the lock watch alone.
func (r *Runner) HoldLockWatchForTest() (release func()) { return hold(&r.lockHold) }

func hold(p *atomic.Pointer[sync.RWMutex]) (release func()) {
	h := new(sync.RWMutex)
	h.Lock()
	p.Store(h)
	return sync.OnceFunc(func() {
		p.Store(nil)
		h.Unlock()
	})
}

// OnServeForTest makes f see every request this runner's transport
// answers, with its answer.
func (r *Runner) OnServeForTest(f func(*transport.DeliverRequest, *transport.DeliverResponse)) {
	r.onServe.Store(&f)
}
