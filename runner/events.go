package runner

import (
	"sync"
	"time"

	"github.com/shardhost/shardhost/detachment"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Event is one entry of a runner's event stream. The concrete types are
// ShardAcquired, ShardReleased, ShardLost, Registered, Detached and
// Reattached. Events of one runner are delivered in the order the state
// changed; Time is taken at the change (local clock, monotonic reading).
type Event interface {
	// Base returns the fields every event has.
	Base() EventBase
}

// EventBase is embedded in every event.
type EventBase struct {
	Runner string    // runner ID
	Time   time.Time // when the state changed
}

// Base implements Event.
func (b EventBase) Base() EventBase { return b }

// ShardAcquired: the runner started owning Shard at Epoch; its entities may
// run from now on.
type ShardAcquired struct {
	EventBase
	Shard sharding.ShardID
	Epoch storage.Epoch
}

// ShardReleased: the runner stopped owning Shard in a planned way (its
// entities were drained; the lock is being deleted or handed over).
type ShardReleased struct {
	EventBase
	Shard sharding.ShardID
	Epoch storage.Epoch
	// Interrupted counts the entities still busy when the drain ended
	// (DrainTimeout, a handler ignoring its context): they got no Release
	// hook, so whatever they did since their last checkpoint is lost.
	Interrupted int
}

// ShardLost: the runner stopped owning Shard without a planned release:
// Cause is ErrDetached (the whole runner detached), ErrShardMoved (this
// shard's lock was deleted, rewritten or taken behind its back),
// ErrShutdown (Close, or Run's context ended) or ErrDuplicateRunnerID (it
// gave its ID up to another process).
type ShardLost struct {
	EventBase
	Shard sharding.ShardID
	Epoch storage.Epoch
	Cause error
}

// Registered: the runner registered under Lease (first start, or after its
// previous lease was lost).
type Registered struct {
	EventBase
	Lease storage.LeaseID
}

// Detached: the runner detached; every shard was dropped at Time.
type Detached struct {
	EventBase
	Reason   detachment.Reason
	Detail   string
	Deadline time.Time // the lease deadline known at the time
}

// Reattached: the runner re-attached after RecoverWindow of health.
type Reattached struct {
	EventBase
	Lease    storage.LeaseID
	NewLease bool // the old lease was lost and a new one granted
}

// Subscription receives a runner's events. Delivery never blocks the
// runner: undelivered events queue in memory until read or Close.
type Subscription struct {
	ch     chan Event
	done   chan struct{}
	signal chan struct{}
	wg     sync.WaitGroup
	hub    *hub

	mu     sync.Mutex
	queue  []Event
	closed bool
}

// Events returns the channel of events. It is closed after Close.
func (s *Subscription) Events() <-chan Event { return s.ch }

// Close ends the subscription and waits for its goroutine.
func (s *Subscription) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	s.hub.remove(s)
	close(s.done)
	s.wg.Wait()
}

func (s *Subscription) push(ev Event) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.queue = append(s.queue, ev)
	s.mu.Unlock()
	signal(s.signal)
}

func (s *Subscription) forward() {
	defer close(s.ch)
	for {
		s.mu.Lock()
		batch := s.queue
		s.queue = nil
		s.mu.Unlock()
		for _, ev := range batch {
			select {
			case s.ch <- ev:
			case <-s.done:
				return
			}
		}
		select {
		case <-s.signal:
		case <-s.done:
			return
		}
	}
}

type hub struct {
	mu      sync.Mutex
	subs    map[*Subscription]struct{}
	recent  eventRing   // the last events, for the debug handler
	observe func(Event) // if set, sees every event first (under mu; must not block)
}

func (h *hub) subscribe() *Subscription {
	s := &Subscription{ch: make(chan Event), done: make(chan struct{}), signal: make(chan struct{}, 1), hub: h}
	h.mu.Lock()
	if h.subs == nil {
		h.subs = make(map[*Subscription]struct{})
	}
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	s.wg.Go(s.forward)
	return s
}

func (h *hub) remove(s *Subscription) {
	h.mu.Lock()
	delete(h.subs, s)
	h.mu.Unlock()
}

func (h *hub) publish(ev Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recent.add(ev)
	if h.observe != nil {
		h.observe(ev)
	}
	for s := range h.subs {
		s.push(ev)
	}
}
