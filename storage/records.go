package storage

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

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
	// LeaseTTL is the granted TTL of the lease the record is attached to
	// (nanoseconds in JSON; 0 when unknown). A runner that finds its ID
	// registered by another process waits this long for a crashed
	// predecessor's lease to expire.
	LeaseTTL time.Duration `json:"leaseTTL,omitempty"`
	// DebugURL is where the runner serves its debug page (see
	// ValidateDebugURL), so that every runner's page can fetch its state;
	// empty when it publishes none.
	DebugURL string `json:"debugURL,omitempty"`
	// Stopped is written by a runner's clean Shutdown, just before it
	// revokes its lease: every shard it held under this lease it released
	// itself, after the drain in which its handlers ended, and it never
	// detached under it. A sender may then acknowledge a late reply of this
	// lease even after the lease ended (see runner/internal/routing). A
	// stopped record has weight 0 and is draining.
	Stopped bool `json:"stopped,omitempty"`
}

// Validate reports whether the record can be stored: a valid runner ID
// (see [ValidateRunnerID]) and incarnation, an address that is empty or
// host:port, a weight in [0, sharding.MaxWeight], a non-negative LeaseTTL,
// a Started time that JSON can represent, and weight 0 and draining when
// Stopped.
func (r RunnerRecord) Validate() error {
	if err := ValidateRunnerID(r.ID); err != nil {
		return err
	}
	switch {
	case !validName(r.Incarnation):
		return fmt.Errorf("%w: runner %q: incarnation %q: want 1-128 characters without '/' or control characters", ErrInvalidArgument, r.ID, r.Incarnation)
	case r.Weight < 0 || r.Weight > sharding.MaxWeight:
		return fmt.Errorf("%w: runner %q: weight %d outside [0, %d]", ErrInvalidArgument, r.ID, r.Weight, sharding.MaxWeight)
	case r.LeaseTTL < 0:
		return fmt.Errorf("%w: runner %q: negative lease TTL %v", ErrInvalidArgument, r.ID, r.LeaseTTL)
	case r.Stopped && (r.Weight != 0 || !r.Draining):
		return fmt.Errorf("%w: runner %q: stopped with weight %d, draining %v: a stopped runner has weight 0 and is draining", ErrInvalidArgument, r.ID, r.Weight, r.Draining)
	case r.Started.Year() < 0 || r.Started.Year() > 9999:
		return fmt.Errorf("%w: runner %q: start time %v outside years 0-9999", ErrInvalidArgument, r.ID, r.Started)
	}
	if r.Address != "" {
		if err := validAddress(r.Address); err != nil {
			return fmt.Errorf("%w: runner %q: address %q: %v", ErrInvalidArgument, r.ID, r.Address, err)
		}
	}
	if r.DebugURL != "" {
		if err := ValidateDebugURL(r.DebugURL); err != nil {
			return fmt.Errorf("runner %q: %w", r.ID, err)
		}
	}
	return nil
}

// ValidateDebugURL reports an ErrInvalidArgument unless u is an absolute
// http or https URL with a host, printable UTF-8 of at most 1024 bytes: the
// rule for RunnerRecord.DebugURL.
func ValidateDebugURL(u string) error {
	if len(u) > 1024 || !utf8.ValidString(u) || strings.ContainsFunc(u, unicode.IsControl) {
		return fmt.Errorf("%w: debug URL %q: want printable UTF-8 of at most 1024 bytes", ErrInvalidArgument, u)
	}
	p, err := url.Parse(u)
	if err != nil {
		return fmt.Errorf("%w: debug URL %q: %v", ErrInvalidArgument, u, err)
	}
	if (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return fmt.Errorf("%w: debug URL %q: want http://host:port/path or https://...", ErrInvalidArgument, u)
	}
	return nil
}

// ValidateRunnerID reports an ErrInvalidArgument unless id is a valid runner
// ID: 1-128 bytes of valid UTF-8 without '/' or control characters. It is
// the rule stores apply to runner records.
func ValidateRunnerID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty runner ID", ErrInvalidArgument)
	}
	if !validName(id) {
		return fmt.Errorf("%w: runner ID %q: want 1-128 bytes of UTF-8 without '/' or control characters", ErrInvalidArgument, id)
	}
	return nil
}

// validName reports whether s is 1-128 bytes of valid UTF-8 without '/'
// or control characters.
func validName(s string) bool {
	if len(s) == 0 || len(s) > 128 || !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if c == '/' || unicode.IsControl(c) {
			return false
		}
	}
	return true
}

// validAddress checks a transport address: host:port with a non-empty host
// and a port in 1-65535, printable.
func validAddress(a string) error {
	if len(a) > 512 || !utf8.ValidString(a) || strings.ContainsFunc(a, unicode.IsControl) {
		return errors.New("want printable UTF-8 of at most 512 bytes")
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("empty host")
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("port %q: want 1-65535", port)
	}
	return nil
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

// Validate reports whether o can be stored: a valid runner ID and an
// incarnation (possibly empty) without '/' or control characters.
func (o Owner) Validate() error {
	if !validName(o.RunnerID) {
		return fmt.Errorf("%w: lock owner: runner ID %q: want 1-128 bytes of UTF-8 without '/' or control characters", ErrInvalidArgument, o.RunnerID)
	}
	if o.Incarnation != "" && !validName(o.Incarnation) {
		return fmt.Errorf("%w: lock owner %q: incarnation %q", ErrInvalidArgument, o.RunnerID, o.Incarnation)
	}
	return nil
}

// Lock is a shard lock as listed from the store.
type Lock struct {
	Shard sharding.ShardID
	Owner Owner
	Lease LeaseID
	Epoch Epoch // the key's ModRevision
}

// HandoffPhase is the phase of a planned move recorded in
// handoffs/{from}/{shard}.
type HandoffPhase string

// Handoff phases written by the target.
const (
	HandoffWarming HandoffPhase = "warming"
	HandoffReady   HandoffPhase = "ready"
)

// HandoffRecord is the value of handoffs/{from}/{shard}, written by the
// target (To) under its own lease.
type HandoffRecord struct {
	From  string       `json:"from"`
	To    string       `json:"to"`
	Phase HandoffPhase `json:"phase"`
	// ToIncarnation names the target's process; FromEpoch the epoch of the
	// source's lock when the handoff started.
	ToIncarnation string `json:"toIncarnation,omitempty"`
	FromEpoch     Epoch  `json:"fromEpoch,omitempty"`
}

// Validate reports whether the record can be stored: valid runner IDs in
// From and To, a known phase, a valid or empty ToIncarnation and a
// non-negative FromEpoch.
func (h HandoffRecord) Validate() error {
	if !validName(h.From) || !validName(h.To) {
		return fmt.Errorf("%w: handoff record needs valid from and to runner IDs (%q, %q)", ErrInvalidArgument, h.From, h.To)
	}
	if h.Phase != HandoffWarming && h.Phase != HandoffReady {
		return fmt.Errorf("%w: handoff phase %q", ErrInvalidArgument, h.Phase)
	}
	if h.ToIncarnation != "" && !validName(h.ToIncarnation) {
		return fmt.Errorf("%w: handoff target incarnation %q", ErrInvalidArgument, h.ToIncarnation)
	}
	if h.FromEpoch < 0 {
		return fmt.Errorf("%w: handoff source epoch %d", ErrInvalidArgument, h.FromEpoch)
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
	if err := o.Validate(); err != nil {
		return nil, err
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

// The decoders below are strict: a value must be one JSON object in valid
// UTF-8 with every required member present (not null), each member at most
// once, of the right type and valid (the Validate rules of its record), and
// nothing after the object. Members they do not know are ignored, so a newer
// version may add optional members during a rolling upgrade. Keys must be
// canonical: a runner ID equal to the record's, a shard number as
// sharding.ParseShardID accepts it.

// DecodeRunner decodes a key of KeyspaceRunners. Errors are *CorruptError.
func DecodeRunner(kv KeyValue) (Runner, error) {
	corrupt := func(err error) (Runner, error) {
		return Runner{}, &CorruptError{Keyspace: KeyspaceRunners, Key: kv.Key, Err: err}
	}
	if err := ValidateRunnerID(kv.Key); err != nil {
		return corrupt(fmt.Errorf("key: %w", err))
	}
	obj, err := parseObject(kv.Value)
	if err != nil {
		return corrupt(err)
	}
	var rec RunnerRecord
	var ttl int64
	if err := errors.Join(
		member(obj, "id", true, &rec.ID),
		member(obj, "address", false, &rec.Address),
		member(obj, "weight", true, &rec.Weight),
		member(obj, "incarnation", true, &rec.Incarnation),
		member(obj, "started", true, &rec.Started),
		member(obj, "draining", false, &rec.Draining),
		member(obj, "leaseTTL", false, &ttl),
		member(obj, "debugURL", false, &rec.DebugURL),
		member(obj, "stopped", false, &rec.Stopped),
	); err != nil {
		return corrupt(err)
	}
	rec.LeaseTTL = time.Duration(ttl)
	if rec.ID != kv.Key {
		return corrupt(fmt.Errorf("record names runner %q", rec.ID))
	}
	if err := rec.Validate(); err != nil {
		return corrupt(err)
	}
	return Runner{RunnerRecord: rec, Lease: kv.Lease, ModRevision: kv.ModRevision}, nil
}

// DecodeLock decodes a key of KeyspaceShards. On a corrupt value it returns
// the Lock with its shard, lease and epoch (ownership does not depend on the
// value) together with a *CorruptError; a corrupt key yields a zero Lock
// (Epoch 0) and a *CorruptError.
func DecodeLock(kv KeyValue) (Lock, error) {
	shard, err := sharding.ParseShardID(kv.Key)
	if err != nil {
		return Lock{}, &CorruptError{Keyspace: KeyspaceShards, Key: kv.Key, Err: err}
	}
	l := Lock{Shard: shard, Lease: kv.Lease, Epoch: Epoch(kv.ModRevision)}
	o, err := decodeOwner(kv.Value)
	if err != nil {
		return l, &CorruptError{Keyspace: KeyspaceShards, Key: kv.Key, Err: err}
	}
	l.Owner = o
	return l, nil
}

func decodeOwner(b []byte) (Owner, error) {
	// Fast path: exactly what EncodeOwner writes (a valid owner whose
	// encoding is these bytes) is accepted without the strict parse.
	var fast Owner
	if json.Unmarshal(b, &fast) == nil && fast.Validate() == nil {
		if enc, err := json.Marshal(fast); err == nil && bytes.Equal(enc, b) {
			return fast, nil
		}
	}
	obj, err := parseObject(b)
	if err != nil {
		return Owner{}, err
	}
	var o Owner
	if err := errors.Join(
		member(obj, "runnerID", true, &o.RunnerID),
		member(obj, "incarnation", true, &o.Incarnation),
	); err != nil {
		return Owner{}, err
	}
	if err := o.Validate(); err != nil {
		return Owner{}, err
	}
	return o, nil
}

// DecodeHandoff decodes a key of HandoffsFrom(from) (its name a shard
// number; the record must name from as its old owner). Errors are *CorruptError;
// with a corrupt value the Handoff still carries its shard, lease and
// revision, with a corrupt key it is zero.
func DecodeHandoff(from string, kv KeyValue) (Handoff, error) {
	ks := HandoffsFrom(from)
	shard, err := sharding.ParseShardID(kv.Key)
	if err != nil {
		return Handoff{}, &CorruptError{Keyspace: ks, Key: kv.Key, Err: err}
	}
	h := Handoff{Shard: shard, Lease: kv.Lease, ModRevision: kv.ModRevision}
	rec, err := decodeHandoffRecord(kv.Value)
	if err == nil && rec.From != from {
		err = fmt.Errorf("record names old owner %q under the prefix of %q", rec.From, from)
	}
	if err != nil {
		return h, &CorruptError{Keyspace: ks, Key: kv.Key, Err: err}
	}
	h.HandoffRecord = rec
	return h, nil
}

// DecodeHandoffListed decodes a key of KeyspaceHandoffs listed whole (its
// name "{from}/{shard}"), as DecodeHandoff.
func DecodeHandoffListed(kv KeyValue) (Handoff, error) {
	from, shard, ok := strings.Cut(kv.Key, "/")
	if !ok || ValidateRunnerID(from) != nil {
		return Handoff{}, &CorruptError{Keyspace: KeyspaceHandoffs, Key: kv.Key, Err: errors.New("key: want {old owner}/{shard}")}
	}
	kv.Key = shard
	return DecodeHandoff(from, kv)
}

func decodeHandoffRecord(b []byte) (HandoffRecord, error) {
	obj, err := parseObject(b)
	if err != nil {
		return HandoffRecord{}, err
	}
	var rec HandoffRecord
	if err := errors.Join(
		member(obj, "from", true, &rec.From),
		member(obj, "to", true, &rec.To),
		member(obj, "phase", true, &rec.Phase),
		member(obj, "toIncarnation", false, &rec.ToIncarnation),
		member(obj, "fromEpoch", false, &rec.FromEpoch),
	); err != nil {
		return HandoffRecord{}, err
	}
	if err := rec.Validate(); err != nil {
		return HandoffRecord{}, err
	}
	return rec, nil
}

// checkpointValue is the stored form of a checkpoint.
type checkpointValue struct {
	Epoch Epoch  `json:"epoch"`
	Data  []byte `json:"data"`
}

// EncodeCheckpoint returns the stored form of a checkpoint written at epoch
// (which the stores check is positive before writing).
func EncodeCheckpoint(epoch Epoch, data []byte) []byte {
	b, _ := json.Marshal(checkpointValue{Epoch: epoch, Data: data}) // cannot fail
	return b
}

// DecodeCheckpoint decodes the value of a checkpoint key. The value needs
// both members, "epoch" (positive: the writer's epoch) and "data" (base64,
// or null for none); anything else, such as null, {} or a negative epoch,
// is a *CorruptError naming the key.
func DecodeCheckpoint(shard sharding.ShardID, name string, value []byte, rev Revision) (Checkpoint, error) {
	v, err := decodeCheckpointValue(value)
	if err != nil {
		return Checkpoint{}, &CorruptError{Keyspace: "checkpoints", Key: strings.TrimPrefix(CheckpointKey(shard, name), "checkpoints/"), Err: err}
	}
	return Checkpoint{Data: v.Data, Epoch: v.Epoch, Revision: rev}, nil
}

func decodeCheckpointValue(b []byte) (checkpointValue, error) {
	obj, err := parseObject(b)
	if err != nil {
		return checkpointValue{}, err
	}
	var v checkpointValue
	if err := member(obj, "epoch", true, &v.Epoch); err != nil {
		return checkpointValue{}, err
	}
	if v.Epoch <= 0 {
		return checkpointValue{}, fmt.Errorf("epoch %d, want > 0", v.Epoch)
	}
	if _, ok := obj["data"]; !ok {
		return checkpointValue{}, errors.New(`missing member "data"`)
	}
	if err := member(obj, "data", false, &v.Data); err != nil {
		return checkpointValue{}, err
	}
	return v, nil
}

// parseObject decodes b as exactly one JSON object in valid UTF-8, each
// member name at most once, and returns its members undecoded.
func parseObject(b []byte) (map[string]json.RawMessage, error) {
	if len(b) == 0 {
		return nil, errors.New("empty value")
	}
	if !utf8.Valid(b) {
		return nil, errors.New("not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("not a JSON object (starts with %v)", tok)
	}
	obj := make(map[string]json.RawMessage)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("not JSON: %w", err)
		}
		name, _ := tok.(string) // object keys are always strings
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("member %q: %w", name, err)
		}
		if _, dup := obj[name]; dup {
			return nil, fmt.Errorf("member %q given twice", name)
		}
		obj[name] = raw
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON object")
	}
	return obj, nil
}

// member decodes obj[name] into v. A member that is absent or null is an
// error when required and leaves v alone otherwise.
func member[T any](obj map[string]json.RawMessage, name string, required bool, v *T) error {
	raw, ok := obj[name]
	if !ok || string(raw) == "null" {
		if required {
			return fmt.Errorf("missing member %q", name)
		}
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("member %q: %w", name, err)
	}
	return nil
}
