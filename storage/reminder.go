package storage

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/shardhost/shardhost/sharding"
)

// The reminders family of the per-shard state layout (shardstate.go):
//
//	reminders/{shard}                       the shard's ReminderProgress
//	reminders/{shard}/{kind/id}/{name}      one Reminder

// ReminderKey is the key of an entity's reminder relative to the namespace.
func ReminderKey(shard sharding.ShardID, e EntityRef, name string) string {
	return string(KeyspaceReminders) + "/" + shard.String() + "/" + entitySegment(e) + "/" + url.PathEscape(name)
}

// ProgressKey is the key of a shard's ReminderProgress relative to the
// namespace.
func ProgressKey(shard sharding.ShardID) string {
	return string(KeyspaceReminders) + "/" + shard.String()
}

// Reminder is one durable reminder of an entity, the value of
// reminders/{shard}/{kind/id}/{name}.
type Reminder struct {
	Shard  sharding.ShardID
	Entity EntityRef
	Name   string // 1-128 bytes of UTF-8 without control characters
	Method string // the kind's reminder handler
	First  time.Time
	// Period between ticks; 0 for a one-shot reminder.
	Period time.Duration
	// Skip: ticks missed during an unplanned loss are skipped, not fired
	// once (entity.Skip).
	Skip    bool
	Payload []byte
	// Epoch of the writer; Revision of the write (set when read).
	Epoch    Epoch
	Revision Revision
}

// maxReminderHorizon bounds First (from the Unix epoch, either way) and
// Period: a century, as entity.MaxReminderHorizon allows from now.
const maxReminderHorizon = 200 * 365 * 24 * time.Hour

// MaxReminderPayload bounds a stored reminder's payload (entity's limit
// with room to spare for other codecs' framing).
const MaxReminderPayload = 8192

// Validate reports whether r can be stored.
func (r Reminder) Validate() error {
	if err := r.Entity.validate(); err != nil {
		return err
	}
	if !validTimerName(r.Name) {
		return fmt.Errorf("%w: reminder name %q: want 1-128 bytes of UTF-8 without control characters", ErrInvalidArgument, r.Name)
	}
	switch {
	case !validTimerName(r.Method):
		return fmt.Errorf("%w: reminder %q: method %q", ErrInvalidArgument, r.Name, r.Method)
	case r.Period < 0 || r.Period > maxReminderHorizon:
		return fmt.Errorf("%w: reminder %q: period %v", ErrInvalidArgument, r.Name, r.Period)
	case r.First.IsZero() || r.First.Year() < 1900 || r.First.Year() > 2500:
		return fmt.Errorf("%w: reminder %q: first fire %v outside years 1900-2500", ErrInvalidArgument, r.Name, r.First)
	case len(r.Payload) > MaxReminderPayload:
		return fmt.Errorf("%w: reminder %q: payload of %d bytes, at most %d", ErrInvalidArgument, r.Name, len(r.Payload), MaxReminderPayload)
	}
	return nil
}

// LastDue returns the number of the last tick of r due at or before t
// (ticks count from 1; 0 when none is due yet). A one-shot reminder has
// one tick.
func (r Reminder) LastDue(t time.Time) uint64 {
	if t.Before(r.First) {
		return 0
	}
	if r.Period <= 0 {
		return 1
	}
	return 1 + uint64(t.Sub(r.First)/r.Period)
}

// DueOf returns the due time of tick n (n >= 1) of r.
func (r Reminder) DueOf(n uint64) time.Time {
	if n <= 1 || r.Period <= 0 {
		return r.First
	}
	return r.First.Add(time.Duration(n-1) * r.Period)
}

// reminderValue is the stored form of a reminder (the key holds its shard,
// entity and name).
type reminderValue struct {
	Method  string `json:"method"`
	First   int64  `json:"first"` // Unix nanoseconds
	Period  int64  `json:"period,omitempty"`
	Skip    bool   `json:"skip,omitempty"`
	Payload []byte `json:"payload,omitempty"`
	Epoch   Epoch  `json:"epoch"`
}

// EncodeReminder returns the stored form of r.
func EncodeReminder(r Reminder) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(reminderValue{Method: r.Method, First: r.First.UnixNano(), Period: int64(r.Period), Skip: r.Skip, Payload: r.Payload, Epoch: r.Epoch})
}

// DecodeReminder decodes a key of KeyspaceReminders that names a reminder
// (not a shard's progress: see DecodeProgress). Errors are *CorruptError.
func DecodeReminder(kv KeyValue) (Reminder, error) {
	corrupt := func(err error) (Reminder, error) {
		return Reminder{}, &CorruptError{Keyspace: KeyspaceReminders, Key: kv.Key, Err: err}
	}
	parts := strings.Split(kv.Key, "/")
	if len(parts) != 3 {
		return corrupt(errors.New("key: want {shard}/{kind%2Fid}/{name}"))
	}
	shard, err := sharding.ParseShardID(parts[0])
	if err != nil {
		return corrupt(fmt.Errorf("key: %w", err))
	}
	ent, err := parseEntitySegment(parts[1])
	if err != nil {
		return corrupt(fmt.Errorf("key: %w", err))
	}
	name, err := url.PathUnescape(parts[2])
	if err != nil || url.PathEscape(name) != parts[2] {
		return corrupt(fmt.Errorf("key: name segment %q not canonically escaped", parts[2]))
	}
	v, err := decodeReminderValue(kv.Value)
	if err != nil {
		return corrupt(err)
	}
	if v.Epoch <= 0 {
		return corrupt(fmt.Errorf("epoch %d, want > 0", v.Epoch))
	}
	r := Reminder{
		Shard: shard, Entity: ent, Name: name, Method: v.Method, First: time.Unix(0, v.First).UTC(),
		Period: time.Duration(v.Period), Skip: v.Skip, Payload: v.Payload, Epoch: v.Epoch, Revision: kv.ModRevision,
	}
	if err := r.Validate(); err != nil {
		return corrupt(err)
	}
	return r, nil
}

// decodeReminderValue decodes a reminder's value strictly. Fast path:
// exactly what EncodeReminder writes (the value re-encodes to the same
// bytes) is accepted without the strict token-by-token parse, which a
// cold start with millions of reminders would pay per record.
func decodeReminderValue(b []byte) (reminderValue, error) {
	var fast reminderValue
	if json.Unmarshal(b, &fast) == nil && fast.Method != "" && fast.First != 0 {
		if enc, err := json.Marshal(fast); err == nil && bytes.Equal(enc, b) {
			return fast, nil
		}
	}
	obj, err := parseObject(b)
	if err != nil {
		return reminderValue{}, err
	}
	var v reminderValue
	if err := errors.Join(
		member(obj, "method", true, &v.Method),
		member(obj, "first", true, &v.First),
		member(obj, "period", false, &v.Period),
		member(obj, "skip", false, &v.Skip),
		member(obj, "payload", false, &v.Payload),
		member(obj, "epoch", true, &v.Epoch),
	); err != nil {
		return reminderValue{}, err
	}
	return v, nil
}

// ReminderProgress is the value of reminders/{shard}: which ticks of the
// shard's reminders were fired, as far as an owner knew when it wrote it.
//
// Every tick due at or before Cut of a reminder written at or before the
// progress (Revision) fired, except for the reminders listed in Fired,
// whose last fired tick is given there (a lower bound when Uncertain). An owner writes a Final progress
// after it stopped firing for good at its epoch (a handoff or a release);
// the next owner rewrites it with Final false before it fires anything, so
// a Final progress is exact, and any other is only a lower bound (its
// writer, or a later owner, may have fired more).
type ReminderProgress struct {
	Shard sharding.ShardID
	Epoch Epoch // the writer's
	Final bool
	Cut   time.Time
	Fired []FiredTick
	// Revision of the write (set when read).
	Revision Revision
}

// FiredTick is the last fired tick of one reminder, at the reminder
// record's revision. Uncertain says the writer did not know whether ticks
// after Tick had fired (it loaded the reminder after an unplanned loss and
// had not fired it since): Tick is then only a lower bound, and the next
// owner's first fire of it is a redelivery.
type FiredTick struct {
	Entity    EntityRef
	Name      string
	Revision  Revision // of the reminder record this applies to
	Tick      uint64
	Uncertain bool
}

// MaxProgressFired bounds ReminderProgress.Fired (the reminders not in
// step with Cut when the progress was written).
const MaxProgressFired = 20000

type progressValue struct {
	Epoch Epoch       `json:"epoch"`
	Final bool        `json:"final"`
	Cut   int64       `json:"cut"` // Unix nanoseconds
	Fired []firedTick `json:"fired,omitempty"`
}

type firedTick struct {
	Entity    string   `json:"entity"` // escaped kind/id
	Name      string   `json:"name"`
	Rev       Revision `json:"rev"`
	Tick      uint64   `json:"tick"`
	Uncertain bool     `json:"uncertain,omitempty"`
}

// Validate reports whether p can be stored.
func (p ReminderProgress) Validate() error {
	if p.Cut.Year() < 1900 || p.Cut.Year() > 2500 {
		return fmt.Errorf("%w: shard %d: progress cut %v outside years 1900-2500", ErrInvalidArgument, p.Shard, p.Cut)
	}
	if len(p.Fired) > MaxProgressFired {
		return fmt.Errorf("%w: shard %d: progress lists %d reminders, at most %d", ErrInvalidArgument, p.Shard, len(p.Fired), MaxProgressFired)
	}
	for _, f := range p.Fired {
		if err := f.Entity.validate(); err != nil {
			return err
		}
		if !validTimerName(f.Name) || f.Revision <= 0 {
			return fmt.Errorf("%w: shard %d: progress of reminder %q at revision %d", ErrInvalidArgument, p.Shard, f.Name, f.Revision)
		}
	}
	return nil
}

// EncodeProgress returns the stored form of p.
func EncodeProgress(p ReminderProgress) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	v := progressValue{Epoch: p.Epoch, Final: p.Final, Cut: p.Cut.UnixNano()}
	for _, f := range p.Fired {
		v.Fired = append(v.Fired, firedTick{Entity: entitySegment(f.Entity), Name: f.Name, Rev: f.Revision, Tick: f.Tick, Uncertain: f.Uncertain})
	}
	return json.Marshal(v)
}

// DecodeProgress decodes the key reminders/{shard}. Errors are
// *CorruptError.
func DecodeProgress(kv KeyValue) (ReminderProgress, error) {
	corrupt := func(err error) (ReminderProgress, error) {
		return ReminderProgress{}, &CorruptError{Keyspace: KeyspaceReminders, Key: kv.Key, Err: err}
	}
	shard, err := sharding.ParseShardID(kv.Key)
	if err != nil {
		return corrupt(fmt.Errorf("key: %w", err))
	}
	obj, err := parseObject(kv.Value)
	if err != nil {
		return corrupt(err)
	}
	var v progressValue
	if err := errors.Join(
		member(obj, "epoch", true, &v.Epoch),
		member(obj, "final", true, &v.Final),
		member(obj, "cut", true, &v.Cut),
		member(obj, "fired", false, &v.Fired),
	); err != nil {
		return corrupt(err)
	}
	if v.Epoch <= 0 {
		return corrupt(fmt.Errorf("epoch %d, want > 0", v.Epoch))
	}
	p := ReminderProgress{Shard: shard, Epoch: v.Epoch, Final: v.Final, Cut: time.Unix(0, v.Cut).UTC(), Revision: kv.ModRevision}
	for _, f := range v.Fired {
		e, err := parseEntitySegment(f.Entity)
		if err != nil {
			return corrupt(err)
		}
		p.Fired = append(p.Fired, FiredTick{Entity: e, Name: f.Name, Revision: f.Rev, Tick: f.Tick, Uncertain: f.Uncertain})
	}
	if err := p.Validate(); err != nil {
		return corrupt(err)
	}
	return p, nil
}
