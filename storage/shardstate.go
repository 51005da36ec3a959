package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/shardhost/shardhost/sharding"
)

// The per-shard state layout. Besides its lock and checkpoints, a shard's
// owner keeps durable state of the shard's entities in families of keys
// that all follow one layout, relative to the namespace:
//
//	{family}/{shard}                               the shard's own record of the family
//	{family}/{shard}/{escaped kind/id}             an entity's record
//	{family}/{shard}/{escaped kind/id}/{escaped name}   a named record of an entity
//
// where an escaped segment is url.PathEscape of it (so "/" inside a kind,
// an ID or a name never splits a key), and every write and delete is
// fenced by the shard's epoch: Compare(ModRevision(shards/{shard}) ==
// epoch) in the same transaction. One range read,
// [{family}/{shard}, {family}/{shard}0), returns a shard's whole family
// ('/' sorts just below '0'), and a read-only transaction of such ranges
// reads many shards at one revision. The families:
//
//	checkpoints/{shard}[/{kind/id}]         fenced checkpoints (Checkpoints)
//	reminders/{shard}                       the shard's ReminderProgress
//	reminders/{shard}/{kind/id}/{name}      one Reminder
//	remembered/{shard}/{kind/id}            one RememberedEntity
//	singletons/{shard}/{name}               one SingletonRecord: where a singleton runs, since when
//	stateorder/{shard}                      empty; its revision orders one client's state writes (stateorder.go)
const (
	KeyspaceReminders  Keyspace = "reminders"
	KeyspaceRemembered Keyspace = "remembered"
	KeyspaceSingletons Keyspace = "singletons"
)

// EntityRef names an entity in stored records: its kind's name and its ID.
type EntityRef struct{ Kind, ID string }

func (e EntityRef) String() string { return e.Kind + "/" + e.ID }

// validate checks that the entity can be named in a key: a kind of 1-128
// bytes of UTF-8 without '/' or control characters, an ID of valid UTF-8
// of at most 1024 bytes.
func (e EntityRef) validate() error {
	if !validName(e.Kind) {
		return fmt.Errorf("%w: entity kind %q: want 1-128 bytes of UTF-8 without '/' or control characters", ErrInvalidArgument, e.Kind)
	}
	if len(e.ID) > 1024 || !utf8.ValidString(e.ID) {
		return fmt.Errorf("%w: entity ID of %s: want valid UTF-8 of at most 1024 bytes", ErrInvalidArgument, e.Kind)
	}
	return nil
}

// entitySegment is the escaped key segment of an entity.
func entitySegment(e EntityRef) string { return url.PathEscape(e.Kind + "/" + e.ID) }

// parseEntitySegment is the inverse of entitySegment, strict.
func parseEntitySegment(seg string) (EntityRef, error) {
	raw, err := url.PathUnescape(seg)
	if err != nil {
		return EntityRef{}, fmt.Errorf("entity segment %q: %w", seg, err)
	}
	kind, id, ok := strings.Cut(raw, "/")
	e := EntityRef{Kind: kind, ID: id}
	if !ok || e.validate() != nil || entitySegment(e) != seg {
		return EntityRef{}, fmt.Errorf("entity segment %q: want an escaped kind/id", seg)
	}
	return e, nil
}

// ShardFamilyRange returns the [start, end) keys, relative to the
// namespace, of shard's records of family ks.
func ShardFamilyRange(ks Keyspace, shard sharding.ShardID) (start, end string) {
	start = string(ks) + "/" + shard.String()
	return start, start + "0"
}

// SingletonKey is the key of a singleton's record relative to the
// namespace.
func SingletonKey(shard sharding.ShardID, name string) string {
	return string(KeyspaceSingletons) + "/" + shard.String() + "/" + url.PathEscape(name)
}

// SingletonRecord says where the singleton Name runs: on Runner, which
// owns Shard at Epoch, since Started. It is informative (operators, the
// debug page): written when an instance starts, fenced by the epoch, so a
// record whose Epoch is not the shard lock's current one is stale (its
// runner crashed, or the next owner has not started the singleton yet).
type SingletonRecord struct {
	Shard    sharding.ShardID
	Name     string
	Runner   string
	Started  time.Time
	Epoch    Epoch    // the writer's (set by the write)
	Revision Revision // of the write (set when read)
}

type singletonValue struct {
	Runner  string `json:"runner"`
	Started int64  `json:"started"` // Unix nanoseconds
	Epoch   Epoch  `json:"epoch"`
}

// EncodeSingleton returns the stored form of r.
func EncodeSingleton(r SingletonRecord) ([]byte, error) {
	if !validTimerName(r.Name) || !validName(r.Runner) {
		return nil, fmt.Errorf("%w: singleton %q on runner %q", ErrInvalidArgument, r.Name, r.Runner)
	}
	return json.Marshal(singletonValue{Runner: r.Runner, Started: r.Started.UnixNano(), Epoch: r.Epoch})
}

// DecodeSingleton decodes a key of KeyspaceSingletons. Errors are
// *CorruptError.
func DecodeSingleton(kv KeyValue) (SingletonRecord, error) {
	corrupt := func(err error) (SingletonRecord, error) {
		return SingletonRecord{}, &CorruptError{Keyspace: KeyspaceSingletons, Key: kv.Key, Err: err}
	}
	shardPart, seg, ok := strings.Cut(kv.Key, "/")
	if !ok {
		return corrupt(errors.New("key: want {shard}/{name}"))
	}
	shard, err := sharding.ParseShardID(shardPart)
	if err != nil {
		return corrupt(fmt.Errorf("key: %w", err))
	}
	name, err := url.PathUnescape(seg)
	if err != nil || url.PathEscape(name) != seg || !validTimerName(name) {
		return corrupt(fmt.Errorf("key: name segment %q", seg))
	}
	obj, err := parseObject(kv.Value)
	if err != nil {
		return corrupt(err)
	}
	var v singletonValue
	if err := errors.Join(member(obj, "runner", true, &v.Runner), member(obj, "started", true, &v.Started), member(obj, "epoch", true, &v.Epoch)); err != nil {
		return corrupt(err)
	}
	if v.Epoch <= 0 || !validName(v.Runner) {
		return corrupt(fmt.Errorf("epoch %d, runner %q", v.Epoch, v.Runner))
	}
	return SingletonRecord{Shard: shard, Name: name, Runner: v.Runner, Started: time.Unix(0, v.Started).UTC(), Epoch: v.Epoch, Revision: kv.ModRevision}, nil
}

// RememberedKey is the key of a remembered entity relative to the
// namespace.
func RememberedKey(shard sharding.ShardID, e EntityRef) string {
	return string(KeyspaceRemembered) + "/" + shard.String() + "/" + entitySegment(e)
}

// RememberedEntity is an entity its shard's owner activates without a
// message, the value of remembered/{shard}/{kind/id}.
type RememberedEntity struct {
	Shard  sharding.ShardID
	Entity EntityRef
	// Epoch of the writer; Revision of the write (set when read).
	Epoch    Epoch
	Revision Revision
}

type rememberedValue struct {
	Epoch Epoch `json:"epoch"`
}

// EncodeRemembered returns the stored form of r.
func EncodeRemembered(r RememberedEntity) ([]byte, error) {
	if err := r.Entity.validate(); err != nil {
		return nil, err
	}
	return json.Marshal(rememberedValue{Epoch: r.Epoch})
}

// DecodeRemembered decodes a key of KeyspaceRemembered. Errors are
// *CorruptError.
func DecodeRemembered(kv KeyValue) (RememberedEntity, error) {
	corrupt := func(err error) (RememberedEntity, error) {
		return RememberedEntity{}, &CorruptError{Keyspace: KeyspaceRemembered, Key: kv.Key, Err: err}
	}
	shardPart, seg, ok := strings.Cut(kv.Key, "/")
	if !ok {
		return corrupt(errors.New("key: want {shard}/{kind%2Fid}"))
	}
	shard, err := sharding.ParseShardID(shardPart)
	if err != nil {
		return corrupt(fmt.Errorf("key: %w", err))
	}
	e, err := parseEntitySegment(seg)
	if err != nil {
		return corrupt(fmt.Errorf("key: %w", err))
	}
	obj, err := parseObject(kv.Value)
	if err != nil {
		return corrupt(err)
	}
	var v rememberedValue
	if err := member(obj, "epoch", true, &v.Epoch); err != nil {
		return corrupt(err)
	}
	if v.Epoch <= 0 {
		return corrupt(fmt.Errorf("epoch %d, want > 0", v.Epoch))
	}
	return RememberedEntity{Shard: shard, Entity: e, Epoch: v.Epoch, Revision: kv.ModRevision}, nil
}

// ShardState is the durable per-shard state of one shard (reminders,
// their progress, remembered entities) as read at one revision. Records
// that failed to decode are not in it: each is a *CorruptError in Corrupt.
type ShardState struct {
	Shard      sharding.ShardID
	Reminders  []Reminder
	Progress   *ReminderProgress // nil when none was written
	Remembered []RememberedEntity
	Corrupt    []error
	Revision   Revision // the store revision the state was read at
}

// DecodeShardState sorts the keys of shard's families (relative to their
// keyspace, as ShardFamilyRange returns them) into a ShardState.
func DecodeShardState(shard sharding.ShardID, rev Revision, reminders, remembered []KeyValue) ShardState {
	st := ShardState{Shard: shard, Revision: rev}
	for _, kv := range reminders {
		if !strings.Contains(kv.Key, "/") {
			p, err := DecodeProgress(kv)
			if err == nil && p.Shard == shard {
				st.Progress = &p
			} else if err != nil {
				st.Corrupt = append(st.Corrupt, err)
			}
			continue
		}
		r, err := DecodeReminder(kv)
		switch {
		case err != nil:
			st.Corrupt = append(st.Corrupt, err)
		case r.Shard == shard:
			st.Reminders = append(st.Reminders, r)
		}
	}
	for _, kv := range remembered {
		r, err := DecodeRemembered(kv)
		switch {
		case err != nil:
			st.Corrupt = append(st.Corrupt, err)
		case r.Shard == shard:
			st.Remembered = append(st.Remembered, r)
		}
	}
	return st
}

// ShardWrite is a set of changes to one shard's state, all or nothing,
// fenced by the shard's epoch. Its Puts and Deletes hold at most
// MaxShardWriteOps operations together.
type ShardWrite struct {
	Shard sharding.ShardID
	Epoch Epoch
	// Reminders to put (Epoch set to the write's) and to delete.
	PutReminders    []Reminder
	DeleteReminders []ReminderRef
	// Progress, if set, replaces the shard's progress.
	Progress *ReminderProgress
	// Remembered entities to put and to delete.
	PutRemembered    []EntityRef
	DeleteRemembered []EntityRef
	// Singleton records to put (Epoch set to the write's) and to delete
	// (by name).
	PutSingletons    []SingletonRecord
	DeleteSingletons []string
}

// ReminderRef names one reminder of a shard.
type ReminderRef struct {
	Entity EntityRef
	Name   string
}

// MaxShardWriteOps bounds the operations of one ShardWrite (one less than
// MaxShardsPerTxn: the store adds the put of the shard's order key).
const MaxShardWriteOps = MaxShardsPerTxn - 1

// Ops returns the number of store operations of w.
func (w ShardWrite) Ops() int {
	n := len(w.PutReminders) + len(w.DeleteReminders) + len(w.PutRemembered) + len(w.DeleteRemembered) +
		len(w.PutSingletons) + len(w.DeleteSingletons)
	if w.Progress != nil {
		n++
	}
	return n
}

// ShardWriteResult is the outcome of one ShardWrite.
type ShardWriteResult struct {
	Shard    sharding.ShardID
	Revision Revision // of the write, when Err is nil
	Err      error    // a *FencedError, or the transaction's error
}

// StateOp is one encoded operation of a ShardWrite: a put of Value at Key
// (relative to the namespace) or, with Delete, a delete of Key.
type StateOp struct {
	Key    string
	Value  []byte
	Delete bool
}

// EncodeShardWrite validates w and returns its operations, in the order
// the store applies them.
func EncodeShardWrite(w ShardWrite) ([]StateOp, error) {
	if err := CheckEpoch(w.Shard, w.Epoch); err != nil {
		return nil, err
	}
	if n := w.Ops(); n == 0 || n > MaxShardWriteOps {
		return nil, fmt.Errorf("%w: shard %d: a state write of %d operations, want 1-%d", ErrInvalidArgument, w.Shard, n, MaxShardWriteOps)
	}
	var ops []StateOp
	seen := make(map[string]bool, w.Ops())
	add := func(op StateOp) error {
		if seen[op.Key] {
			return fmt.Errorf("%w: shard %d: key %s written twice", ErrInvalidArgument, w.Shard, op.Key)
		}
		seen[op.Key] = true
		ops = append(ops, op)
		return nil
	}
	for _, r := range w.PutReminders {
		r.Epoch = w.Epoch
		if r.Shard != w.Shard {
			return nil, fmt.Errorf("%w: reminder of shard %d in a write of shard %d", ErrInvalidArgument, r.Shard, w.Shard)
		}
		v, err := EncodeReminder(r)
		if err != nil {
			return nil, err
		}
		if err := add(StateOp{Key: ReminderKey(w.Shard, r.Entity, r.Name), Value: v}); err != nil {
			return nil, err
		}
	}
	for _, r := range w.DeleteReminders {
		if err := r.Entity.validate(); err != nil {
			return nil, err
		}
		if !validTimerName(r.Name) {
			return nil, fmt.Errorf("%w: reminder name %q", ErrInvalidArgument, r.Name)
		}
		if err := add(StateOp{Key: ReminderKey(w.Shard, r.Entity, r.Name), Delete: true}); err != nil {
			return nil, err
		}
	}
	if w.Progress != nil {
		p := *w.Progress
		p.Shard, p.Epoch = w.Shard, w.Epoch
		v, err := EncodeProgress(p)
		if err != nil {
			return nil, err
		}
		if err := add(StateOp{Key: ProgressKey(w.Shard), Value: v}); err != nil {
			return nil, err
		}
	}
	for _, e := range w.PutRemembered {
		v, err := EncodeRemembered(RememberedEntity{Shard: w.Shard, Entity: e, Epoch: w.Epoch})
		if err != nil {
			return nil, err
		}
		if err := add(StateOp{Key: RememberedKey(w.Shard, e), Value: v}); err != nil {
			return nil, err
		}
	}
	for _, e := range w.DeleteRemembered {
		if err := e.validate(); err != nil {
			return nil, err
		}
		if err := add(StateOp{Key: RememberedKey(w.Shard, e), Delete: true}); err != nil {
			return nil, err
		}
	}
	for _, r := range w.PutSingletons {
		r.Epoch = w.Epoch
		v, err := EncodeSingleton(r)
		if err != nil {
			return nil, err
		}
		if err := add(StateOp{Key: SingletonKey(w.Shard, r.Name), Value: v}); err != nil {
			return nil, err
		}
	}
	for _, name := range w.DeleteSingletons {
		if !validTimerName(name) {
			return nil, fmt.Errorf("%w: singleton name %q", ErrInvalidArgument, name)
		}
		if err := add(StateOp{Key: SingletonKey(w.Shard, name), Delete: true}); err != nil {
			return nil, err
		}
	}
	return ops, nil
}

// MaxStateTxnBytes bounds the encoded size of the writes batched into one
// transaction (etcd refuses requests above --max-request-bytes, 1.5 MiB by
// default); a single ShardWrite above it is refused.
const MaxStateTxnBytes = 1 << 20

// StateBatches splits encoded writes into transactions: at most
// MaxShardsPerTxn writes and MaxStateTxnBytes of keys and values each, in
// order. It returns [lo, hi) index pairs, or an ErrInvalidArgument naming
// a write that alone exceeds the byte bound.
func StateBatches(shards []sharding.ShardID, ops [][]StateOp) ([][2]int, error) {
	var out [][2]int
	lo, size := 0, 0
	for i, w := range ops {
		n := 0
		for _, op := range w {
			n += len(op.Key) + len(op.Value) + 16
		}
		if n > MaxStateTxnBytes {
			return nil, fmt.Errorf("%w: shard %d: a state write of %d bytes, at most %d", ErrInvalidArgument, shards[i], n, MaxStateTxnBytes)
		}
		if i > lo && (i-lo >= MaxShardsPerTxn || size+n > MaxStateTxnBytes) {
			out = append(out, [2]int{lo, i})
			lo, size = i, 0
		}
		size += n
	}
	if lo < len(ops) {
		out = append(out, [2]int{lo, len(ops)})
	}
	return out, nil
}

// ShardStates reads and writes the per-shard state of the shards' owners
// (see the layout above).
type ShardStates interface {
	// ReadShardStates reads the state of each shard (distinct), one
	// read-only transaction per MaxShardsPerTxn/2 shards, each at one
	// revision. Results are in the order of shards.
	ReadShardStates(ctx context.Context, shards []sharding.ShardID) ([]ShardState, error)
	// WriteShardStates applies each write if its shard's lock is at its
	// epoch, atomically per write (shards distinct), several writes per
	// transaction (StateBatches). One client's writes to a shard are
	// ordered (stateorder.go): one whose outcome was unknown never lands
	// after a later one succeeded. Results are in the order of writes: a
	// *FencedError when the epoch is not current, or the transaction's
	// error (the outcome of a failed transaction is unknown), the first of
	// which is also returned. Invalid writes fail the call with
	// ErrInvalidArgument before anything is written.
	WriteShardStates(ctx context.Context, writes []ShardWrite) ([]ShardWriteResult, error)
}

// CheckShardWrites validates writes and encodes them (see
// EncodeShardWrite); shards must be distinct.
func CheckShardWrites(writes []ShardWrite) ([][]StateOp, []sharding.ShardID, error) {
	ids := make([]sharding.ShardID, len(writes))
	ops := make([][]StateOp, len(writes))
	for i, w := range writes {
		o, err := EncodeShardWrite(w)
		if err != nil {
			return nil, nil, err
		}
		ids[i], ops[i] = w.Shard, o
	}
	if err := CheckShards(ids); err != nil {
		return nil, nil, err
	}
	return ops, ids, nil
}

// validTimerName reports whether s is 1-128 bytes of valid UTF-8 without
// control characters ('/' allowed: names are escaped in keys).
func validTimerName(s string) bool {
	if len(s) == 0 || len(s) > 128 || !utf8.ValidString(s) {
		return false
	}
	return !strings.ContainsFunc(s, unicode.IsControl)
}
