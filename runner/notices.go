package runner

import (
	"context"
	"slices"
	"time"

	"github.com/shardhost/shardhost/storage"
)

// Notices (storage.Notices): the changes of a shard's lock that concern
// this runner reach it under notices/{self}/, written in the same
// transaction as the change — a handoff's transfer of a lock to this
// runner (moved), a lock released by a runner that saw this one as the
// shard's assignee (released). They are applied as the lock events they
// announce, then deleted (batched, in the background).

// followNotices applies the notices to this runner.
func (r *Runner) followNotices(ctx context.Context) {
	ks := storage.NoticesTo(r.cfg.ID)
	_ = storage.Follow(ctx, r.store, ks, func(u storage.Update) {
		if u.Err != nil {
			return // the runner watch reports storage trouble
		}
		r.mu.Lock()
		if u.Reset {
			r.keys.forget(ks)
			for _, kv := range u.KVs {
				r.applyNoticeLocked(ks, kv)
			}
		}
		for _, ev := range u.Events {
			if ev.Type == storage.EventPut {
				r.applyNoticeLocked(ks, ev.KV)
			}
		}
		r.flushLostLocked()
		r.mu.Unlock()
		r.router.RoutesChanged()
		signal(r.sig.noticeGC)
	})
}

// applyNoticeLocked applies one notice as the lock event it announces and
// queues it for deletion.
func (r *Runner) applyNoticeLocked(ks storage.Keyspace, kv storage.KeyValue) {
	n, err := storage.DecodeNotice(ks, kv)
	if n.ModRevision > 0 && int(n.Shard) < r.cfg.NumShards {
		r.noticesSeen = append(r.noticesSeen, storage.NoticeSeen{Shard: n.Shard, Revision: n.ModRevision})
	}
	if err != nil {
		r.keys.bad(ks, kv.Key, "ignoring a corrupt notice", err)
		return
	}
	if _, ok := r.keys.shardOf(ks, kv.Key); !ok {
		return
	}
	r.keys.good(ks, kv.Key)
	rev := storage.Epoch(n.ModRevision)
	switch n.Kind {
	case storage.NoticeMoved:
		// The transfer that wrote it put the lock under the new owner's
		// lease, naming its incarnation, at this very revision. Not this
		// attachment's (a notice of an earlier lease or process): history.
		if n.Lease != r.att.lease || n.Lease == storage.NoLease || n.Incarnation != r.incarnation {
			return
		}
		r.shards.recordGone(n.Shard, storage.Revision(rev)) // the transfer deleted it
		r.applyLockPutLocked(storage.Lock{Shard: n.Shard, Owner: r.owner(), Lease: n.Lease, Epoch: rev})
	case storage.NoticeReleased:
		if l, ok := r.view.locks.Get(n.Shard); ok && l.Epoch > rev {
			return // the lock was written again since
		}
		// Our handoff record, if any, stays: the round deletes it once
		// no takeover needs it (control.Decision.DeleteRecord).
		r.applyLockDeleteLocked(n.Shard, rev)
		// The release deleted the lock at this very revision: a holder
		// read before it (an acquire's reply that comes after this
		// notice) is history.
		if p := r.shards.at(n.Shard).pending; p != nil && rev > p.goneAt {
			p.goneAt = rev
		}
	}
}

// noticeGCBatch bounds the notices one deletion call covers (each call is
// bounded by OpTimeout).
const noticeGCBatch = shardsPerCall

// collectNotices deletes the notices this runner applied, batched, until
// ctx ends. A failed deletion is retried with the next batch; a notice
// left behind is harmless (applied again after a re-listing, it changes
// nothing) and vanishes with its lease.
func (r *Runner) collectNotices(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.sig.noticeGC:
		}
		r.mu.Lock()
		seen := r.noticesSeen
		r.noticesSeen = nil
		r.mu.Unlock()
		// Distinct shards per call: the newest revision of each.
		slices.SortFunc(seen, func(a, b storage.NoticeSeen) int {
			if a.Shard != b.Shard {
				return int(a.Shard) - int(b.Shard)
			}
			return int(b.Revision - a.Revision)
		})
		seen = slices.CompactFunc(seen, func(a, b storage.NoticeSeen) bool { return a.Shard == b.Shard })
		var failed []storage.NoticeSeen
		for chunk := range slices.Chunk(seen, noticeGCBatch) {
			cctx, cancel := r.opCtx(ctx)
			_, err := r.store.DeleteNotices(cctx, r.cfg.ID, chunk)
			cancel()
			if err != nil && ctx.Err() == nil {
				failed = append(failed, chunk...)
			}
		}
		if len(failed) > 0 {
			r.log.Debug("deleting applied notices failed; retrying later", "notices", len(failed))
			r.mu.Lock()
			r.noticesSeen = append(r.noticesSeen, failed...)
			r.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(r.cfg.AcquireRetryWindow):
			}
			signal(r.sig.noticeGC)
		}
	}
}
