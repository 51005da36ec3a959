package runner

import (
	"sync"

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
	h := new(sync.RWMutex)
	h.Lock()
	r.viewHold.Store(h)
	return sync.OnceFunc(func() {
		r.viewHold.Store(nil)
		h.Unlock()
	})
}

// OnServeForTest makes f see every request this runner's transport
// answers, with its answer.
func (r *Runner) OnServeForTest(f func(*transport.DeliverRequest, *transport.DeliverResponse)) {
	r.onServe.Store(&f)
}
