package runner

import "github.com/shardhost/shardhost/transport"

// ParkedForTest returns how many requests wait parked here (park.go).
func (r *Runner) ParkedForTest() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.parked.total
}

// OnServeForTest makes f see every request this runner's transport
// answers, with its answer.
func (r *Runner) OnServeForTest(f func(*transport.DeliverRequest, *transport.DeliverResponse)) {
	r.onServe.Store(&f)
}
