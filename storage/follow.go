package storage

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Update is one step of a [Follow]ed keyspace.
type Update struct {
	// Reset: KVs is the whole keyspace at Revision; state derived from
	// earlier updates must be replaced. The first update of Follow is a
	// reset, and so is every update after a watch could not continue.
	Reset bool
	KVs   []KeyValue
	// Events are the changes since the previous update, in revision order
	// (only when !Reset and Err == nil).
	Events []Event
	// Revision is the revision the view is at after this update.
	Revision Revision
	// Err reports a failed list or watch. It carries no data; Follow
	// lists again (after a backoff unless the revision was compacted) and
	// the next successful update is a reset.
	Err error
}

// Follow keeps fn informed of the content of ks until ctx is done: it lists
// the keyspace, then watches from the listed revision + 1, so no change is
// lost between the two. When the watch fails (compaction, transport) it
// reports the error, lists again and reports a reset. fn is called from the
// calling goroutine, one update at a time; it must not block for long.
// Follow returns ctx's error.
func Follow(ctx context.Context, l Lister, ks Keyspace, fn func(Update)) error {
	const (
		minBackoff = 50 * time.Millisecond
		maxBackoff = 2 * time.Second
	)
	backoff := minBackoff
	wait := func() bool {
		t := time.NewTimer(backoff)
		defer t.Stop()
		backoff = min(2*backoff, maxBackoff)
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for ctx.Err() == nil {
		snap, err := l.List(ctx, ks)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			fn(Update{Err: err})
			if !wait() {
				break
			}
			continue
		}
		fn(Update{Reset: true, KVs: snap.KVs, Revision: snap.Revision})
		rev, err := followWatch(ctx, l, ks, snap.Revision, fn)
		if ctx.Err() != nil {
			break
		}
		if rev > snap.Revision {
			backoff = minBackoff // the watch made progress: the store works
		}
		fn(Update{Err: err, Revision: rev})
		if !errors.Is(err, ErrCompacted) && !wait() {
			break
		}
	}
	return ctx.Err()
}

// followWatch forwards watch events from rev+1 until the watch ends, and
// returns the last revision seen and the reason it ended.
func followWatch(ctx context.Context, l Lister, ks Keyspace, rev Revision, fn func(Update)) (Revision, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for resp := range l.Watch(wctx, ks, rev+1) {
		if resp.Err != nil {
			return rev, resp.Err
		}
		if len(resp.Events) == 0 {
			continue
		}
		rev = resp.Events[len(resp.Events)-1].KV.ModRevision
		fn(Update{Events: resp.Events, Revision: rev})
	}
	if err := ctx.Err(); err != nil {
		return rev, err
	}
	return rev, fmt.Errorf("%w: watch channel closed", ErrUnavailable)
}
