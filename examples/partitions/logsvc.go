package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/shardhost/shardhost/sharding"
)

// record is one entry of a partition's log: add delta to key.
type record struct {
	key   int32 // index into logService.keys
	delta int32
}

// logService is an in-process stand-in for a partitioned, append-only log
// such as a Kafka topic: producers append records to partitions, consumers
// read ranges of them. Reading costs simulated time per record (fetch and
// decode), which is what makes a consumer that starts from offset 0 slow.
// Partition p holds the records of the keys of shard p: one partition per
// shard.
type logService struct {
	perRecord time.Duration
	keys      []string         // key index -> name
	index     map[string]int32 // name -> key index
	byPart    [][]int32        // partition -> indices of its keys
	parts     []partition
	// Ground truth per key, for the final check; a key's entries are
	// guarded by the mutex of its partition.
	sum, count []int64
}

type partition struct {
	mu   sync.Mutex
	recs []record
	rnd  *rand.Rand // the producer's choices for this partition
}

// newLogService creates numParts partitions with keysPerPart keys each
// (named key-0, key-1, ..., each in the partition of its shard) and
// history records already in every partition.
func newLogService(numParts, keysPerPart, history int, perRecord time.Duration) *logService {
	l := &logService{perRecord: perRecord, index: map[string]int32{}, byPart: make([][]int32, numParts), parts: make([]partition, numParts)}
	for i, full := 0, 0; full < numParts; i++ {
		name := fmt.Sprintf("key-%d", i)
		p := sharding.ShardOf(name, numParts)
		if len(l.byPart[p]) == keysPerPart {
			continue
		}
		idx := int32(len(l.keys))
		l.keys = append(l.keys, name)
		l.index[name] = idx
		l.byPart[p] = append(l.byPart[p], idx)
		if len(l.byPart[p]) == keysPerPart {
			full++
		}
	}
	l.sum, l.count = make([]int64, len(l.keys)), make([]int64, len(l.keys))
	for p := range l.parts {
		l.parts[p].rnd = rand.New(rand.NewPCG(uint64(p), 42))
		l.parts[p].recs = make([]record, 0, history+history/2)
		l.appendRandom(p, history)
	}
	return l
}

// appendRandom appends n records for random keys of partition p, each
// adding 1 to 9.
func (l *logService) appendRandom(p, n int) {
	part := &l.parts[p]
	part.mu.Lock()
	defer part.mu.Unlock()
	keys := l.byPart[p]
	for range n {
		r := record{key: keys[part.rnd.IntN(len(keys))], delta: int32(1 + part.rnd.IntN(9))}
		part.recs = append(part.recs, r)
		l.sum[r.key] += int64(r.delta)
		l.count[r.key]++
	}
}

// Head is the number of records in partition p: the offset the next
// record gets.
func (l *logService) Head(p sharding.ShardID) int64 {
	part := &l.parts[p]
	part.mu.Lock()
	defer part.mu.Unlock()
	return int64(len(part.recs))
}

// Read returns up to n records of partition p from offset from, after
// their simulated reading time (n*perRecord at most), or ctx's error.
func (l *logService) Read(ctx context.Context, p sharding.ShardID, from int64, n int) ([]record, error) {
	part := &l.parts[p]
	part.mu.Lock()
	end := min(from+int64(n), int64(len(part.recs)))
	recs := make([]record, 0, max(end-from, 0))
	if from < end {
		recs = append(recs, part.recs[from:end]...)
	}
	part.mu.Unlock()
	if len(recs) == 0 {
		return recs, nil
	}
	t := time.NewTimer(time.Duration(len(recs)) * l.perRecord)
	defer t.Stop()
	select {
	case <-t.C:
		return recs, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// Truth returns the sum and count of key from every record appended so
// far (free: it is the check's ground truth, not a consumer).
func (l *logService) Truth(key string) (sum, count int64) {
	idx := l.index[key]
	part := &l.parts[sharding.ShardOf(key, len(l.parts))]
	part.mu.Lock()
	defer part.mu.Unlock()
	return l.sum[idx], l.count[idx]
}

// readBatch is how many records a consumer reads per call.
const readBatch = 500

// view is a materialized view of one partition: the sum and count of each
// of its keys over the records [0, offset). It is a pure function of a log
// prefix, so an older view is never wrong, only behind: catching it up
// makes it current.
type view struct {
	mu     sync.Mutex // held while applying a batch and while answering
	part   sharding.ShardID
	offset int64
	sum    map[int32]int64
	count  map[int32]int64
	// moved is closed (and replaced) whenever offset advances: readers
	// waiting for the view to reach an offset wait on it.
	moved chan struct{}
}

func newView(p sharding.ShardID) *view {
	return &view{part: p, sum: map[int32]int64{}, count: map[int32]int64{}, moved: make(chan struct{})}
}

// applyLocked applies recs (the records from offset on) and wakes the
// readers waiting for the view to advance.
func (v *view) applyLocked(recs []record) {
	for _, r := range recs {
		v.sum[r.key] += int64(r.delta)
		v.count[r.key]++
	}
	v.offset += int64(len(recs))
	close(v.moved)
	v.moved = make(chan struct{})
}

// consume reads the partition from the view's offset up to to, one batch
// at a time, applying each batch under the view's lock (readers answer
// between batches). It returns how many records it consumed. Only one
// goroutine consumes a view at a time: the shard's worker, or WarmShard
// before the worker starts.
func (v *view) consume(ctx context.Context, l *logService, to int64) (int64, error) {
	var n int64
	for {
		v.mu.Lock()
		from := v.offset
		v.mu.Unlock()
		if from >= to {
			return n, nil
		}
		recs, err := l.Read(ctx, v.part, from, int(min(to-from, readBatch)))
		if err != nil {
			return n, err
		}
		if len(recs) == 0 {
			return n, nil
		}
		v.mu.Lock()
		v.applyLocked(recs)
		v.mu.Unlock()
		n += int64(len(recs))
	}
}

// waitLocked waits, with v.mu held, until the view applied the records
// before offset to (releasing the lock while it waits).
func (v *view) waitLocked(ctx context.Context, to int64) error {
	for v.offset < to {
		moved := v.moved
		v.mu.Unlock()
		select {
		case <-moved:
			v.mu.Lock()
		case <-ctx.Done():
			v.mu.Lock()
			return context.Cause(ctx)
		}
	}
	return nil
}

// views are one runner's materialized views, by partition (= shard).
type views struct {
	mu sync.Mutex
	m  map[sharding.ShardID]*view
}

// get returns the view of partition p, creating an empty one.
func (vs *views) get(p sharding.ShardID) *view {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if vs.m == nil {
		vs.m = map[sharding.ShardID]*view{}
	}
	v := vs.m[p]
	if v == nil {
		v = newView(p)
		vs.m[p] = v
	}
	return v
}

func (vs *views) drop(p sharding.ShardID) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	delete(vs.m, p)
}
