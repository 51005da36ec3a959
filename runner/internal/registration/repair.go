package registration

import (
	"context"
	"errors"
	"fmt"

	"github.com/shardhost/shardhost/storage"
)

// Repair compares the latest observation of the key with the record
// wanted and, if it differs, restores it under lease with ctx (attached is
// the context of the runner's attachment). Call it while attached, after
// Changed. It returns:
//
//   - again and the store error when the write failed (try again later);
//   - an error matching ErrDuplicateRunnerID when another live process
//     that started first registered the ID (the runner gives up);
//   - neither otherwise (nothing to do, restored, or changed again: the
//     watch shows how).
func (c *Record) Repair(ctx, attached context.Context, lease storage.LeaseID) (again bool, err error) {
	replaceAt, fatal, ok := c.decide(lease)
	if fatal != nil || !ok {
		return false, fatal
	}
	c.mu.Lock()
	want := c.want
	c.mu.Unlock()
	var rev storage.Revision
	if replaceAt == 0 {
		rev, err = c.store.PutRunner(ctx, lease, want)
	} else {
		rev, err = c.store.ReplaceRunner(ctx, lease, want, replaceAt)
	}
	switch {
	case err == nil:
		c.NoteWritten(rev)
		c.log.Info("own runner record restored", "key", c.key, "revision", rev)
		return false, nil
	case errors.Is(err, storage.ErrRunnerConflict):
		return false, nil // it changed again: the watch shows how
	case attached.Err() != nil:
		return false, nil // detached meanwhile: re-attaching registers again
	default:
		return true, err
	}
}

// decide says how to restore the record: ok with replaceAt (0: PutRunner,
// the key is absent or ours; else ReplaceRunner at that revision), or a
// fatal duplicate, or nothing to do.
func (c *Record) decide(lease storage.LeaseID) (replaceAt storage.Revision, fatal error, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen, want := c.seen, c.want
	if !seen.Known || seen.Rev <= c.rev {
		return 0, nil, false // an observation of our own write (or older)
	}
	switch {
	case !seen.Exists:
		c.log.Warn("own runner record deleted while its lease lives; rewriting it", "key", c.key, "revision", seen.Rev)
		return 0, nil, true
	case seen.KV.Lease == lease:
		got, err := storage.DecodeRunner(seen.KV)
		if err == nil && sameRecord(got.RunnerRecord, want) {
			c.rev = max(c.rev, seen.Rev) // rewritten as it was
			return 0, nil, false
		}
		c.log.Warn("own runner record changed under this runner's lease; rewriting it", "key", c.key, "revision", seen.Rev,
			"detail", recordDiff(got.RunnerRecord, want, err))
		return 0, nil, true
	}
	other, err := storage.DecodeRunner(seen.KV)
	if err != nil || seen.KV.Lease == storage.NoLease || other.Incarnation == c.cfg.Incarnation {
		c.log.Warn("own runner record replaced while its lease lives; restoring it", "key", c.key, "revision", seen.Rev,
			"other_lease", fmt.Sprintf("%x", seen.KV.Lease), "detail", recordDiff(other.RunnerRecord, want, err))
		return seen.Rev, nil, true
	}
	// The process that started first keeps the ID.
	first := other.Started.Before(c.started) || (other.Started.Equal(c.started) && other.Incarnation < c.cfg.Incarnation)
	keeper := "this runner (started first)"
	if first {
		keeper = "the other process (started first)"
	}
	c.log.Error("another process registered with this runner's ID", "key", c.key, "other_incarnation", other.Incarnation,
		"other_address", other.Address, "other_lease", fmt.Sprintf("%x", other.Lease), "other_started", other.Started,
		"keeps_id", keeper)
	if first {
		return 0, fmt.Errorf("%w: %s was registered by incarnation %s (address %q), which started first",
			ErrDuplicateRunnerID, c.key, other.Incarnation, other.Address), false
	}
	return seen.Rev, nil, true
}
