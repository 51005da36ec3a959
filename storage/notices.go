package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/shardhost/shardhost/sharding"
)

// Notices tell one runner of a change to a shard's lock that concerns it,
// written in the same transaction as the change: notices/{to}/{shard}.
// The runner watches its own prefix (NoticesTo) instead of every lock, and
// deletes a notice once it has applied it.
//
//   - NoticeMoved is written by Transfer under the new owner's lease: the
//     lock is the new owner's at the notice's revision (its epoch).
//   - NoticeReleased is written by Release (Held.Tell) under the releasing
//     runner's lease: the lock was deleted at the notice's revision.
//
// A notice only ever makes its runner act sooner: a lost or forged one
// changes no ownership (a moved notice is checked against the runner's own
// lease and incarnation, like the lock it announces; a released one leads
// to an acquisition, which is conditional on the lock being absent).

// NoticeKind says what a notice announces.
type NoticeKind string

// The kinds of notices.
const (
	NoticeMoved    NoticeKind = "moved"
	NoticeReleased NoticeKind = "released"
)

// NoticeRecord is the value of notices/{to}/{shard}.
type NoticeRecord struct {
	Kind NoticeKind `json:"kind"`
	// From is the runner that wrote it (the old owner); Incarnation, for
	// NoticeMoved, the new owner's incarnation the lock names.
	From        string `json:"from,omitempty"`
	Incarnation string `json:"incarnation,omitempty"`
}

// Validate reports whether the record can be stored: a known kind, valid
// or empty names, and an incarnation for a moved notice.
func (n NoticeRecord) Validate() error {
	switch n.Kind {
	case NoticeMoved:
		if !validName(n.Incarnation) {
			return fmt.Errorf("%w: moved notice needs the new owner's incarnation, got %q", ErrInvalidArgument, n.Incarnation)
		}
	case NoticeReleased:
		if n.Incarnation != "" && !validName(n.Incarnation) {
			return fmt.Errorf("%w: notice incarnation %q", ErrInvalidArgument, n.Incarnation)
		}
	default:
		return fmt.Errorf("%w: notice kind %q", ErrInvalidArgument, n.Kind)
	}
	if n.From != "" && !validName(n.From) {
		return fmt.Errorf("%w: notice sender %q", ErrInvalidArgument, n.From)
	}
	return nil
}

// Notice is a notice as listed from the store.
type Notice struct {
	Shard sharding.ShardID
	NoticeRecord
	Lease       LeaseID
	ModRevision Revision
}

// NoticesTo is the keyspace of the notices to runner to (key names are
// shard numbers): what that runner watches.
func NoticesTo(to string) Keyspace { return Keyspace(string(KeyspaceNotices) + "/" + to) }

// NoticeKey is the key of the notice to runner to about shard, relative to
// the namespace: "notices/{to}/{shard}".
func NoticeKey(to string, shard sharding.ShardID) string { return Key(NoticesTo(to), shard.String()) }

// EncodeNotice returns the stored form of n.
func EncodeNotice(n NoticeRecord) ([]byte, error) {
	if err := n.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(n)
}

// DecodeNotice decodes a key of NoticesTo(...) (its name a shard number),
// strictly like the other decoders. Errors are *CorruptError; with a
// corrupt value the Notice still carries its shard and revision.
func DecodeNotice(ks Keyspace, kv KeyValue) (Notice, error) {
	shard, err := sharding.ParseShardID(kv.Key)
	if err != nil {
		return Notice{}, &CorruptError{Keyspace: ks, Key: kv.Key, Err: err}
	}
	n := Notice{Shard: shard, Lease: kv.Lease, ModRevision: kv.ModRevision}
	obj, err := parseObject(kv.Value)
	if err != nil {
		return n, &CorruptError{Keyspace: ks, Key: kv.Key, Err: err}
	}
	var rec NoticeRecord
	if err := errors.Join(
		member(obj, "kind", true, &rec.Kind),
		member(obj, "from", false, &rec.From),
		member(obj, "incarnation", false, &rec.Incarnation),
	); err != nil {
		return n, &CorruptError{Keyspace: ks, Key: kv.Key, Err: err}
	}
	if err := rec.Validate(); err != nil {
		return n, &CorruptError{Keyspace: ks, Key: kv.Key, Err: err}
	}
	n.NoticeRecord = rec
	return n, nil
}

// NoticeSeen names a notice its runner applied: notices/{To}/{Shard} at
// Revision.
type NoticeSeen struct {
	Shard    sharding.ShardID
	Revision Revision
}

// Notices deletes the notices a runner applied.
type Notices interface {
	// DeleteNotices deletes each notices/{to}/{Shard} that is still at
	// its Revision (a newer notice is left for its runner to apply) and
	// returns how many it deleted. Shards must be distinct.
	DeleteNotices(ctx context.Context, to string, seen []NoticeSeen) (int, error)
}

// CheckNotices checks the arguments of DeleteNotices: a valid runner,
// distinct shards and positive revisions.
func CheckNotices(to string, seen []NoticeSeen) error {
	if err := ValidateRunnerID(to); err != nil {
		return err
	}
	ids := make([]sharding.ShardID, len(seen))
	for i, n := range seen {
		if err := CheckRevision(n.Revision); err != nil {
			return err
		}
		ids[i] = n.Shard
	}
	return CheckShards(ids)
}
