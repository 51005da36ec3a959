// Package eventhub delivers a runner's events to its subscribers. It
// guarantees that publishing never blocks the publisher (the runner's
// control paths publish under their locks): each subscription queues what
// its reader has not taken yet, in memory, and a goroutine per
// subscription hands the events over in order. It also keeps the latest
// events for the debug page.
package eventhub

import "sync"

// RecentEvents is how many of the latest events a Hub keeps (Recent).
const RecentEvents = 256

// Hub fans events of type E out to subscriptions. The zero Hub is ready
// to use; set Observe before the first Publish.
type Hub[E any] struct {
	// Observe, if set, sees every event first (under the hub's lock: it
	// must not block).
	Observe func(E)

	mu     sync.Mutex
	subs   map[*Subscription[E]]struct{}
	recent ring[E]
}

// Subscription receives a hub's events. Delivery never blocks the
// publisher: undelivered events queue in memory until read or Close.
type Subscription[E any] struct {
	ch     chan E
	done   chan struct{}
	signal chan struct{}
	wg     sync.WaitGroup
	hub    *Hub[E]

	mu     sync.Mutex
	queue  []E
	closed bool
}

// Events returns the channel of events. It is closed after Close.
func (s *Subscription[E]) Events() <-chan E { return s.ch }

// Close ends the subscription and waits for its goroutine.
func (s *Subscription[E]) Close() {
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

func (s *Subscription[E]) push(ev E) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.queue = append(s.queue, ev)
	s.mu.Unlock()
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

func (s *Subscription[E]) forward() {
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

// Subscribe returns a subscription to the events published from now on.
func (h *Hub[E]) Subscribe() *Subscription[E] {
	s := &Subscription[E]{ch: make(chan E), done: make(chan struct{}), signal: make(chan struct{}, 1), hub: h}
	h.mu.Lock()
	if h.subs == nil {
		h.subs = make(map[*Subscription[E]]struct{})
	}
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	s.wg.Go(s.forward)
	return s
}

func (h *Hub[E]) remove(s *Subscription[E]) {
	h.mu.Lock()
	delete(h.subs, s)
	h.mu.Unlock()
}

// Publish hands ev to every subscription without blocking.
func (h *Hub[E]) Publish(ev E) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recent.add(ev)
	if h.Observe != nil {
		h.Observe(ev)
	}
	for s := range h.subs {
		s.push(ev)
	}
}

// Recent returns up to n of the latest events (at most RecentEvents),
// newest first.
func (h *Hub[E]) Recent(n int) []E {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.recent.last(n)
}

// ring keeps the last RecentEvents events.
type ring[E any] struct {
	buf  [RecentEvents]E
	next int // where the next event goes
	full bool
}

func (e *ring[E]) add(ev E) {
	e.buf[e.next] = ev
	e.next = (e.next + 1) % RecentEvents
	if e.next == 0 {
		e.full = true
	}
}

// last returns up to n of the latest events, newest first.
func (e *ring[E]) last(n int) []E {
	size := e.next
	if e.full {
		size = RecentEvents
	}
	n = min(n, size)
	out := make([]E, 0, n)
	for i := range n {
		out = append(out, e.buf[(e.next-1-i+RecentEvents)%RecentEvents])
	}
	return out
}
