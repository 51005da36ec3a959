package storage

import (
	"errors"
	"fmt"

	"github.com/shardhost/shardhost/sharding"
)

// Sentinel errors. Implementations translate backend errors into these (or
// into the typed errors below, which match them with errors.Is); callers
// never need to match error strings.
var (
	// ErrUnavailable: the store could not be asked or did not answer in
	// time (transport failure, timeout, no leader). Nothing can be concluded
	// about the outcome of a write that failed this way.
	ErrUnavailable = errors.New("storage: unavailable")
	// ErrLeaseNotFound: the lease does not exist (expired or revoked).
	ErrLeaseNotFound = errors.New("storage: lease not found")
	// ErrCompacted: a watch asked for a revision the store no longer keeps.
	ErrCompacted = errors.New("storage: revision compacted")
	// ErrFenced: a fenced write carried an epoch that is no longer current.
	ErrFenced = errors.New("storage: fenced: epoch is not current")
	// ErrCheckpointChanged: a checkpoint write or delete expected the
	// checkpoint at another revision than it is.
	ErrCheckpointChanged = errors.New("storage: checkpoint changed")
	// ErrNotOwner: the caller's lease does not hold the lock at the given epoch.
	ErrNotOwner = errors.New("storage: lock not held by this lease at this epoch")
	// ErrNoHandoff: the handoff record a transfer requires is missing or
	// attached to another lease.
	ErrNoHandoff = errors.New("storage: no handoff record for the target")
	// ErrHandoffConflict: a handoff record of another lease exists.
	ErrHandoffConflict = errors.New("storage: handoff record held by another lease")
	// ErrRunnerConflict: a runner record is held by another lease (or is not
	// at the expected revision) and was left alone.
	ErrRunnerConflict = errors.New("storage: runner record held by another lease")
	// ErrClusterConflict: the cluster record is not at the expected
	// revision (see Clusters.WriteCluster) and was left alone.
	ErrClusterConflict = errors.New("storage: cluster record changed")
	// ErrCorrupt: a stored key or value cannot be decoded.
	ErrCorrupt = errors.New("storage: corrupt record")
	// ErrInvalidArgument: the request itself is malformed.
	ErrInvalidArgument = errors.New("storage: invalid argument")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("storage: closed")
	// ErrPermissionDenied: the store refused the client's credentials.
	ErrPermissionDenied = errors.New("storage: permission denied")
	// ErrStreamLimit: the store's server lets a client hold fewer
	// concurrent streams than a runner needs (see *StreamLimitError).
	ErrStreamLimit = errors.New("storage: too few concurrent streams")
)

// StreamLimitError reports a store server that lets one client connection
// hold fewer concurrent streams than a runner needs: Needed, its watches
// (they share one stream) and a call besides. No retry helps until an
// operator raises the server's setting Flag (etcd:
// --max-concurrent-streams).
type StreamLimitError struct {
	Endpoint string // the server found limited
	Needed   int    // streams a runner holds at once
	Flag     string // the server's setting that bounds them
}

func (e *StreamLimitError) Error() string {
	return fmt.Sprintf("storage: too few concurrent streams: the server at %s did not open a call's stream while a watch stream was open "+
		"(a runner needs %d at once: its watches share one): raise the server's %s", e.Endpoint, e.Needed, e.Flag)
}

// Is makes errors.Is(err, ErrStreamLimit) true.
func (e *StreamLimitError) Is(target error) bool { return target == ErrStreamLimit }

// FencedError reports a checkpoint write rejected because Epoch is not the
// current epoch of Shard's lock. Current is 0 when the lock does not exist.
type FencedError struct {
	Shard   sharding.ShardID
	Epoch   Epoch
	Current Epoch
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("storage: fenced: shard %d epoch %d is not current (current %d)", e.Shard, e.Epoch, e.Current)
}

// Is makes errors.Is(err, ErrFenced) true.
func (e *FencedError) Is(target error) bool { return target == ErrFenced }

// CheckpointChangedError reports a checkpoint write or delete rejected
// because the checkpoint (Shard, Name) is at revision Current (0: none
// exists), not at Prev: a write of the same owner landed in between — one
// whose outcome its writer could not know (see Checkpoints).
type CheckpointChangedError struct {
	Shard         sharding.ShardID
	Name          string
	Prev, Current Revision
}

func (e *CheckpointChangedError) Error() string {
	return fmt.Sprintf("storage: checkpoint %q of shard %d is at revision %d, not %d", e.Name, e.Shard, e.Current, e.Prev)
}

// Is makes errors.Is(err, ErrCheckpointChanged) true.
func (e *CheckpointChangedError) Is(target error) bool { return target == ErrCheckpointChanged }

// HandoffConflictError reports a handoff record attached to another lease.
type HandoffConflictError struct {
	Shard    sharding.ShardID
	Existing Handoff
}

func (e *HandoffConflictError) Error() string {
	return fmt.Sprintf("storage: handoff of shard %d already held by lease %x (to %q)", e.Shard, e.Existing.Lease, e.Existing.To)
}

// Is makes errors.Is(err, ErrHandoffConflict) true.
func (e *HandoffConflictError) Is(target error) bool { return target == ErrHandoffConflict }

// CorruptError reports a key or value that cannot be decoded.
type CorruptError struct {
	Keyspace Keyspace
	Key      string
	Err      error
}

func (e *CorruptError) Error() string {
	if e.Keyspace == "" { // a key of no keyspace (ClusterKey)
		return fmt.Sprintf("storage: corrupt record %s: %v", e.Key, e.Err)
	}
	return fmt.Sprintf("storage: corrupt record %s/%s: %v", e.Keyspace, e.Key, e.Err)
}

// Unwrap returns the decoding error.
func (e *CorruptError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// RunnerConflictError reports a runner record that PutRunner or
// ReplaceRunner left alone: Existing is the key as found (Exists false when
// it was absent).
type RunnerConflictError struct {
	ID       string
	Exists   bool
	Existing KeyValue
}

func (e *RunnerConflictError) Error() string {
	if !e.Exists {
		return fmt.Sprintf("storage: runner record %q is gone", e.ID)
	}
	return fmt.Sprintf("storage: runner record %q held by lease %x at revision %d", e.ID, e.Existing.Lease, e.Existing.ModRevision)
}

// Is makes errors.Is(err, ErrRunnerConflict) true.
func (e *RunnerConflictError) Is(target error) bool { return target == ErrRunnerConflict }
