package hosting

import (
	"context"
	"sync"
	"time"

	"github.com/shardhost/shardhost/sharding"
)

// residents is the runner-wide LRU of resident entities (most recent at
// head) and the resident cap.
type residents struct {
	h          *Host
	mu         sync.Mutex
	head, tail *resident
	n          int
}

func (rs *residents) unlinkLocked(e *resident) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		rs.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		rs.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (rs *residents) pushFrontLocked(e *resident) {
	e.next = rs.head
	if rs.head != nil {
		rs.head.prev = e
	}
	rs.head = e
	if rs.tail == nil {
		rs.tail = e
	}
}

// add lists a new entity (most recent) and wakes the janitor when the
// resident cap is exceeded. Called under the entity's host mutex.
func (rs *residents) add(e *resident) {
	rs.mu.Lock()
	e.lastUsed = time.Since(clockBase)
	e.listed = true
	rs.pushFrontLocked(e)
	rs.n++
	limit := rs.h.cfg.MaxResidentEntities
	over := limit > 0 && rs.n > limit
	rs.mu.Unlock()
	if over {
		signal(rs.h.evictKick)
	}
}

// evict passivates least recently used idle entities until the resident
// cap holds (busy and remembered entities are skipped).
func (rs *residents) evict() {
	limit := rs.h.cfg.MaxResidentEntities
	if limit <= 0 {
		return
	}
	rs.mu.Lock()
	var victims []*resident
	for v := rs.tail; v != nil && rs.n-len(victims) > limit; v = v.prev {
		if v.idle() && !v.pinned() {
			victims = append(victims, v)
		}
	}
	rs.mu.Unlock()
	for _, v := range victims {
		if v.host.retire(v, ErrEvicted) {
			rs.h.met.Evictions.Add(context.Background(), 1, rs.h.met.Attrs)
		}
	}
}

// touch marks e most recently used.
func (rs *residents) touch(e *resident) {
	rs.mu.Lock()
	if e.listed {
		e.lastUsed = time.Since(clockBase)
		if rs.head != e {
			rs.unlinkLocked(e)
			rs.pushFrontLocked(e)
		}
	}
	rs.mu.Unlock()
}

func (rs *residents) remove(e *resident) {
	rs.mu.Lock()
	if e.listed {
		rs.unlinkLocked(e)
		e.listed = false
		rs.n--
	}
	rs.mu.Unlock()
}

// hot returns up to limit resident entities of shard: its remembered
// entities first (they run again on the new owner right after a handoff,
// so they are the first to warm), then the others, most recently used
// first.
func (rs *residents) hot(shard sharding.ShardID, limit int) []EntityKey {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out []EntityKey
	for _, pinned := range []bool{true, false} {
		for e := rs.head; e != nil && len(out) < limit; e = e.next {
			if e.host.id == shard && e.pinned() == pinned {
				out = append(out, e.key)
			}
		}
	}
	return out
}

func (rs *residents) count() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.n
}

// passivateIdle retires every idle entity unused for its kind's IdleAfter
// (remembered entities stay).
func (rs *residents) passivateIdle(now time.Time) {
	at := now.Sub(clockBase)
	rs.mu.Lock()
	var victims []*resident
	for v := rs.tail; v != nil; v = v.prev {
		if at-v.lastUsed >= v.kind.Opts.IdleAfter && !v.pinned() {
			victims = append(victims, v)
		}
	}
	rs.mu.Unlock()
	for _, v := range victims {
		v.host.retire(v, ErrIdleExpired)
	}
}
