// Package sparse holds tables indexed by shard whose memory follows the
// shards that have an entry, not the shard count: a runner of a cluster of
// 65 536 shards that owns a few hundred of them allocates a few hundred
// small chunks, not 65 536 entries per table.
package sparse

import (
	"iter"
	"sync/atomic"
)

// chunkLen is how many consecutive entries one chunk holds: the top level
// costs 8 bytes per chunkLen entries (32 KB at 65 536), a chunk
// chunkLen elements.
const chunkLen = 16

// Table is n elements of type E, indexed from 0, each starting as E's zero
// value. A chunk of chunkLen elements is allocated the first time one of
// its elements is asked for to write (At) and kept from then on.
//
// Finding an element is safe for concurrent use (a chunk is published
// atomically, once); the elements themselves are as safe as E is, so E is
// an atomic type when they are written concurrently.
type Table[E any] struct {
	chunks []atomic.Pointer[[chunkLen]E]
}

// New returns a table of n elements.
func New[E any](n int) *Table[E] {
	return &Table[E]{chunks: make([]atomic.Pointer[[chunkLen]E], (n+chunkLen-1)/chunkLen)}
}

// Len returns the number of elements.
func (t *Table[E]) Len() int { return len(t.chunks) * chunkLen }

// Peek returns element i, or nil when its chunk was never allocated (the
// element is then E's zero value). It never allocates.
func (t *Table[E]) Peek(i int) *E {
	c := t.chunks[i/chunkLen].Load()
	if c == nil {
		return nil
	}
	return &c[i%chunkLen]
}

// At returns element i, allocating its chunk.
func (t *Table[E]) At(i int) *E {
	p := &t.chunks[i/chunkLen]
	c := p.Load()
	if c == nil {
		c = new([chunkLen]E)
		if !p.CompareAndSwap(nil, c) {
			c = p.Load()
		}
	}
	return &c[i%chunkLen]
}

// Allocated yields the index and address of every element of an
// allocated chunk, in index order: E's zero value for most of them.
func (t *Table[E]) Allocated() iter.Seq2[int, *E] {
	return func(yield func(int, *E) bool) {
		for k := range t.chunks {
			c := t.chunks[k].Load()
			if c == nil {
				continue
			}
			for j := range c {
				if !yield(k*chunkLen+j, &c[j]) {
					return
				}
			}
		}
	}
}
