package hosting

import "sync"

// chunkLen is how many messages a mailbox chunk holds: 63 messages of 64
// bytes and the chunk's header fill 4 KiB.
const chunkLen = 63

// chunk holds messages of a burst, beyond the first chunkLen of a mailbox.
type chunk struct {
	msgs [chunkLen]message
	n    int    // messages in msgs
	next *chunk // the next chunk of the same mailbox
}

// chunks recycles chunks across entities: a chunk is given back once its
// messages ran (each zeroed as it ran).
var chunks = sync.Pool{New: func() any { return new(chunk) }}

// mailbox is the queue of an entity's messages, under resident.mu. Its
// first chunkLen messages go to head, a slice the entity's goroutine takes
// whole (a batch) and hands back empty, so a steady flow allocates
// nothing; the rest of a burst goes to chunks from the shared pool, linked
// in order, so a growing mailbox never copies what it holds, and an entity
// keeps at most two slices of chunkLen messages after a burst.
type mailbox struct {
	head        []message
	first, last *chunk // beyond head, oldest first; last is being filled
}

// push appends a copy of m.
func (q *mailbox) push(m *message) {
	if q.first == nil && len(q.head) < chunkLen {
		q.head = append(q.head, *m)
		return
	}
	if q.last == nil || q.last.n == chunkLen {
		c := chunks.Get().(*chunk)
		if q.last == nil {
			q.first = c
		} else {
			q.last.next = c
		}
		q.last = c
	}
	q.last.msgs[q.last.n] = *m
	q.last.n++
}

// each calls f with every message of q in order, zeroing each after f
// returns, and gives q's chunks back; q keeps its head (emptied of
// references, its length unchanged) and loses its chunks.
func (q *mailbox) each(f func(m *message)) {
	for i := range q.head {
		f(&q.head[i])
		q.head[i] = message{}
	}
	for c := q.first; c != nil; {
		for i := range c.n {
			f(&c.msgs[i])
			c.msgs[i] = message{}
		}
		next := c.next
		c.n, c.next = 0, nil
		chunks.Put(c)
		c = next
	}
	q.first, q.last = nil, nil
}
