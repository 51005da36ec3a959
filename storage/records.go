package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shardhost/shardhost/sharding"
)

// RunnerRecord is the value of runners/{ID}.
type RunnerRecord struct {
	ID          string    `json:"id"`                // stable runner name
	Address     string    `json:"address,omitempty"` // host:port of its transport; empty for none
	Weight      int       `json:"weight"`            // relative capacity; 0 = drain (no shards)
	Incarnation string    `json:"incarnation"`       // unique per process start
	Started     time.Time `json:"started"`
	Draining    bool      `json:"draining,omitempty"` // handing its shards off before it stops
}

// Validate reports whether the record can be stored.
func (r RunnerRecord) Validate() error {
	switch {
	case r.ID == "":
		return fmt.Errorf("%w: empty runner ID", ErrInvalidArgument)
	case !validName(r.ID):
		return fmt.Errorf("%w: runner ID %q: want 1-128 characters without '/' or control characters", ErrInvalidArgument, r.ID)
	case r.Incarnation == "":
		return fmt.Errorf("%w: runner %q: empty incarnation", ErrInvalidArgument, r.ID)
	case r.Weight < 0:
		return fmt.Errorf("%w: runner %q: negative weight %d", ErrInvalidArgument, r.ID, r.Weight)
	}
	return nil
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if c == '/' || c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// Runner is a registered runner as listed from the store.
type Runner struct {
	RunnerRecord
	Lease       LeaseID
	ModRevision Revision
}

// Owner is the value of a lock shards/{shard}. It is informative: ownership
// is decided by the lock's lease, never by this value.
type Owner struct {
	RunnerID    string `json:"runnerID"`
	Incarnation string `json:"incarnation"`
}

// Lock is a shard lock as listed from the store.
type Lock struct {
	Shard sharding.ShardID
	Owner Owner
	Lease LeaseID
	Epoch Epoch // the key's ModRevision
}

// HandoffPhase is the phase of a planned move recorded in handoffs/{shard}.
type HandoffPhase string

// Handoff phases written by the target.
const (
	HandoffWarming HandoffPhase = "warming"
	HandoffReady   HandoffPhase = "ready"
)

// HandoffRecord is the value of handoffs/{shard}, written by the target (To)
// under its own lease.
type HandoffRecord struct {
	From  string       `json:"from"`
	To    string       `json:"to"`
	Phase HandoffPhase `json:"phase"`
	// ToIncarnation names the target's process; FromEpoch the epoch of the
	// source's lock when the handoff started.
	ToIncarnation string `json:"toIncarnation,omitempty"`
	FromEpoch     Epoch  `json:"fromEpoch,omitempty"`
}

// Validate reports whether the record can be stored.
func (h HandoffRecord) Validate() error {
	if h.From == "" || h.To == "" {
		return fmt.Errorf("%w: handoff record needs from and to", ErrInvalidArgument)
	}
	if h.Phase != HandoffWarming && h.Phase != HandoffReady {
		return fmt.Errorf("%w: handoff phase %q", ErrInvalidArgument, h.Phase)
	}
	return nil
}

// Handoff is a handoff record as listed from the store.
type Handoff struct {
	Shard sharding.ShardID
	HandoffRecord
	Lease       LeaseID
	ModRevision Revision
}

// EncodeRunner returns the stored form of rec.
func EncodeRunner(rec RunnerRecord) ([]byte, error) {
	if err := rec.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(rec)
}

// EncodeOwner returns the stored form of o.
func EncodeOwner(o Owner) ([]byte, error) {
	if o.RunnerID == "" {
		return nil, fmt.Errorf("%w: lock owner needs a runner ID", ErrInvalidArgument)
	}
	return json.Marshal(o)
}

// EncodeHandoff returns the stored form of h.
func EncodeHandoff(h HandoffRecord) ([]byte, error) {
	if err := h.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(h)
}

// DecodeRunner decodes a key of KeyspaceRunners. Errors are *CorruptError.
func DecodeRunner(kv KeyValue) (Runner, error) {
	var rec RunnerRecord
	if err := decodeJSON(kv.Value, &rec); err != nil {
		return Runner{}, &CorruptError{Keyspace: KeyspaceRunners, Key: kv.Key, Err: err}
	}
	if rec.ID != kv.Key {
		return Runner{}, &CorruptError{Keyspace: KeyspaceRunners, Key: kv.Key, Err: fmt.Errorf("record names runner %q", rec.ID)}
	}
	if err := rec.Validate(); err != nil {
		return Runner{}, &CorruptError{Keyspace: KeyspaceRunners, Key: kv.Key, Err: err}
	}
	return Runner{RunnerRecord: rec, Lease: kv.Lease, ModRevision: kv.ModRevision}, nil
}

// DecodeLock decodes a key of KeyspaceShards. On a corrupt value it returns
// the Lock with its shard, lease and epoch (ownership does not depend on the
// value) together with a *CorruptError; a corrupt key yields a zero Lock.
func DecodeLock(kv KeyValue) (Lock, error) {
	shard, err := sharding.ParseShardID(kv.Key)
	if err != nil {
		return Lock{}, &CorruptError{Keyspace: KeyspaceShards, Key: kv.Key, Err: err}
	}
	l := Lock{Shard: shard, Lease: kv.Lease, Epoch: Epoch(kv.ModRevision)}
	if err := decodeJSON(kv.Value, &l.Owner); err != nil {
		return l, &CorruptError{Keyspace: KeyspaceShards, Key: kv.Key, Err: err}
	}
	if l.Owner.RunnerID == "" {
		return l, &CorruptError{Keyspace: KeyspaceShards, Key: kv.Key, Err: errors.New("empty runner ID")}
	}
	return l, nil
}

// DecodeHandoff decodes a key of KeyspaceHandoffs. Errors are *CorruptError.
func DecodeHandoff(kv KeyValue) (Handoff, error) {
	shard, err := sharding.ParseShardID(kv.Key)
	if err != nil {
		return Handoff{}, &CorruptError{Keyspace: KeyspaceHandoffs, Key: kv.Key, Err: err}
	}
	h := Handoff{Shard: shard, Lease: kv.Lease, ModRevision: kv.ModRevision}
	if err := decodeJSON(kv.Value, &h.HandoffRecord); err != nil {
		return h, &CorruptError{Keyspace: KeyspaceHandoffs, Key: kv.Key, Err: err}
	}
	if err := h.Validate(); err != nil {
		return h, &CorruptError{Keyspace: KeyspaceHandoffs, Key: kv.Key, Err: err}
	}
	return h, nil
}

// checkpointValue is the stored form of a checkpoint.
type checkpointValue struct {
	Epoch Epoch  `json:"epoch"`
	Data  []byte `json:"data"`
}

// EncodeCheckpoint returns the stored form of a checkpoint written at epoch.
func EncodeCheckpoint(epoch Epoch, data []byte) []byte {
	b, _ := json.Marshal(checkpointValue{Epoch: epoch, Data: data}) // cannot fail
	return b
}

// DecodeCheckpoint decodes the value of a checkpoint key.
func DecodeCheckpoint(shard sharding.ShardID, name string, value []byte, rev Revision) (Checkpoint, error) {
	var v checkpointValue
	if err := decodeJSON(value, &v); err != nil {
		return Checkpoint{}, &CorruptError{Keyspace: "checkpoints", Key: strings.TrimPrefix(CheckpointKey(shard, name), "checkpoints/"), Err: err}
	}
	return Checkpoint{Data: v.Data, Epoch: v.Epoch, Revision: rev}, nil
}

func decodeJSON(b []byte, v any) error {
	if len(b) == 0 {
		return errors.New("empty value")
	}
	return json.Unmarshal(b, v)
}

// CheckShards reports an ErrInvalidArgument if shards has duplicates.
func CheckShards(shards []sharding.ShardID) error {
	if len(shards) < 2 {
		return nil
	}
	s := slices.Clone(shards)
	slices.Sort(s)
	for i := 1; i < len(s); i++ {
		if s[i] == s[i-1] {
			return fmt.Errorf("%w: shard %d listed twice", ErrInvalidArgument, s[i])
		}
	}
	return nil
}

// CheckHeld reports an ErrInvalidArgument if held names a shard twice or
// an epoch that is not positive.
func CheckHeld(held []Held) error {
	ids := make([]sharding.ShardID, len(held))
	for i, h := range held {
		if err := CheckEpoch(h.Shard, h.Epoch); err != nil {
			return err
		}
		ids[i] = h.Shard
	}
	return CheckShards(ids)
}

// CheckLease reports an ErrInvalidArgument for NoLease: locks are taken,
// checked, moved and released on behalf of a lease. (etcd compares the
// lease of a missing key as 0, so NoLease would match absent locks.)
func CheckLease(lease LeaseID) error {
	if lease == NoLease {
		return fmt.Errorf("%w: no lease", ErrInvalidArgument)
	}
	return nil
}

// CheckEpoch reports an ErrInvalidArgument for an epoch that is not
// positive. (Epochs are revisions; etcd compares the revision of a missing
// key as 0, so epoch 0 would match an absent lock.)
func CheckEpoch(shard sharding.ShardID, epoch Epoch) error {
	if epoch <= 0 {
		return fmt.Errorf("%w: shard %d: epoch %d, want > 0", ErrInvalidArgument, shard, epoch)
	}
	return nil
}

// CheckHeldBy checks the arguments of Verify and Release: a lease and
// held locks (see CheckLease and CheckHeld).
func CheckHeldBy(lease LeaseID, held []Held) error {
	return errors.Join(CheckLease(lease), CheckHeld(held))
}

// CheckShardsFor checks the arguments of Acquire and Rewrite: a lease and
// distinct shards (see CheckLease and CheckShards).
func CheckShardsFor(lease LeaseID, shards []sharding.ShardID) error {
	return errors.Join(CheckLease(lease), CheckShards(shards))
}

// CheckTransfer reports an ErrInvalidArgument for a transfer without both
// leases or with an epoch that is not positive.
func CheckTransfer(req TransferRequest) error {
	return errors.Join(CheckLease(req.FromLease), CheckLease(req.ToLease), CheckEpoch(req.Shard, req.FromEpoch))
}

// CheckTransfers checks the arguments of Transfer: every request (see
// CheckTransfer), on distinct shards.
func CheckTransfers(reqs []TransferRequest) error {
	ids := make([]sharding.ShardID, len(reqs))
	for i, req := range reqs {
		if err := CheckTransfer(req); err != nil {
			return err
		}
		ids[i] = req.Shard
	}
	return CheckShards(ids)
}

// EncodeHandoffs checks the arguments of PutHandoffs (a lease, valid
// records on distinct shards) and returns the encoded records.
func EncodeHandoffs(lease LeaseID, puts []HandoffPut) ([][]byte, error) {
	ids := make([]sharding.ShardID, len(puts))
	vals := make([][]byte, len(puts))
	for i, p := range puts {
		v, err := EncodeHandoff(p.Record)
		if err != nil {
			return nil, err
		}
		ids[i], vals[i] = p.Shard, v
	}
	if err := CheckShardsFor(lease, ids); err != nil {
		return nil, err
	}
	return vals, nil
}

// Batches splits n items into consecutive [start, end) ranges of at most size.
func Batches(n, size int) [][2]int {
	var out [][2]int
	for start := 0; start < n; start += size {
		out = append(out, [2]int{start, min(start+size, n)})
	}
	return out
}
