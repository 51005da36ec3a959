package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/shardhost/shardhost/sharding"
)

// ClusterKey is the key of the cluster record relative to the namespace.
// It belongs to no keyspace: it is read and written, never listed.
const ClusterKey = "cluster"

// ClusterRecord is the value of the cluster record: the settings every
// runner of a cluster must share, published by the first runner that
// starts and checked by every later one. It has no lease: it outlives
// every runner. To change a setting, stop every runner and delete the key.
type ClusterRecord struct {
	// NumShards is the number of shards of the cluster.
	NumShards int `json:"numShards"`
	// Strategy is the name of the assignment strategy; "" until a hosting
	// runner (not a client-only one, which does not assign) published it.
	Strategy string `json:"strategy,omitempty"`
	// WrittenBy names the runner that wrote the record last.
	WrittenBy string `json:"writtenBy,omitempty"`
	// Layout is the coordination layout of the cluster's runners (see
	// Layout); 0 when unknown (no hosting runner published a strategy).
	Layout int `json:"-"`
}

// Layout is the coordination layout of this version: which keys runners
// write and watch to coordinate. Runners of different layouts cannot share
// a cluster; the cluster record says which one it uses.
//
//   - Layout 1: every runner watched every shard lock (shards/) and every
//     handoff record (handoffs/{shard}).
//   - Layout 2: handoff records are keyed by their old owner
//     (handoffs/{from}/{shard}), lock changes that concern a runner reach
//     it as notices (notices/{to}/{shard}), and a runner watches only the
//     membership and its own prefixes.
//
// A record of layout 2 or later also carries the layout in its strategy
// member ("balanced (layout 2)"), which runners of layout 1 — which ignore
// members they do not know — compare, so that they refuse to join instead
// of mixing silently.
const Layout = 2

// layoutSuffix is what a record of layout n adds to its strategy member.
func layoutSuffix(n int) string { return fmt.Sprintf(" (layout %d)", n) }

// clusterJSON is the stored form of a ClusterRecord.
type clusterJSON struct {
	NumShards int    `json:"numShards"`
	Strategy  string `json:"strategy,omitempty"`
	WrittenBy string `json:"writtenBy,omitempty"`
	Layout    int    `json:"layout,omitempty"`
}

// Validate reports whether the record can be stored: a shard count that
// sharding accepts and a strategy and writer that are empty or valid names.
func (c ClusterRecord) Validate() error {
	if err := sharding.ValidateNumShards(c.NumShards); err != nil {
		return fmt.Errorf("%w: cluster record: %v", ErrInvalidArgument, err)
	}
	if c.Strategy != "" && !validName(c.Strategy) {
		return fmt.Errorf("%w: cluster record: strategy %q", ErrInvalidArgument, c.Strategy)
	}
	if c.WrittenBy != "" && !validName(c.WrittenBy) {
		return fmt.Errorf("%w: cluster record: writer %q", ErrInvalidArgument, c.WrittenBy)
	}
	if c.Layout < 0 || c.Layout > 1000 || c.Layout >= 2 && c.Strategy != "" && !validName(c.Strategy+layoutSuffix(c.Layout)) {
		return fmt.Errorf("%w: cluster record: layout %d", ErrInvalidArgument, c.Layout)
	}
	return nil
}

// ClusterInfo is the cluster record as read from the store.
type ClusterInfo struct {
	ClusterRecord
	ModRevision Revision
}

// EncodeCluster returns the stored form of rec.
func EncodeCluster(rec ClusterRecord) ([]byte, error) {
	if err := rec.Validate(); err != nil {
		return nil, err
	}
	v := clusterJSON{NumShards: rec.NumShards, Strategy: rec.Strategy, WrittenBy: rec.WrittenBy}
	if rec.Layout >= 2 { // layout 1 is what a record without one means
		v.Layout = rec.Layout
		if rec.Strategy != "" {
			v.Strategy += layoutSuffix(rec.Layout)
		}
	}
	return json.Marshal(v)
}

// DecodeCluster decodes the cluster record, strictly like the other
// decoders: "numShards" is required. Errors are *CorruptError naming the
// key; the returned ClusterInfo then still carries the ModRevision, so a
// caller can replace the damaged record where it found it.
func DecodeCluster(kv KeyValue) (ClusterInfo, error) {
	info := ClusterInfo{ModRevision: kv.ModRevision}
	corrupt := func(err error) (ClusterInfo, error) {
		return info, &CorruptError{Keyspace: "", Key: ClusterKey, Err: err}
	}
	obj, err := parseObject(kv.Value)
	if err != nil {
		return corrupt(err)
	}
	var rec ClusterRecord
	if err := errors.Join(
		member(obj, "numShards", true, &rec.NumShards),
		member(obj, "strategy", false, &rec.Strategy),
		member(obj, "writtenBy", false, &rec.WrittenBy),
		member(obj, "layout", false, &rec.Layout),
	); err != nil {
		return corrupt(err)
	}
	switch {
	case rec.Layout >= 2 && rec.Strategy != "":
		name, ok := strings.CutSuffix(rec.Strategy, layoutSuffix(rec.Layout))
		if !ok {
			return corrupt(fmt.Errorf("strategy %q does not carry its layout %d", rec.Strategy, rec.Layout))
		}
		rec.Strategy = name
	case rec.Layout == 0 && rec.Strategy != "":
		rec.Layout = 1 // published before layouts were recorded
	case rec.Layout == 1:
		return corrupt(errors.New("layout 1 is never recorded"))
	}
	if err := rec.Validate(); err != nil {
		return corrupt(err)
	}
	if err := rec.Validate(); err != nil {
		return corrupt(err)
	}
	info.ClusterRecord = rec
	return info, nil
}

// ClusterConflictError reports a cluster record that WriteCluster left
// alone because it was not at the expected revision: Existing is the key
// as found (Exists false when it is absent).
type ClusterConflictError struct {
	Exists   bool
	Existing KeyValue
}

func (e *ClusterConflictError) Error() string {
	if !e.Exists {
		return "storage: cluster record is gone"
	}
	return fmt.Sprintf("storage: cluster record is at revision %d", e.Existing.ModRevision)
}

// Is makes errors.Is(err, ErrClusterConflict) true.
func (e *ClusterConflictError) Is(target error) bool { return target == ErrClusterConflict }

// Clusters holds the cluster record, {namespace}/cluster.
type Clusters interface {
	// ReadCluster returns the cluster record; ok is false when none was
	// written. A record that does not decode is returned with its
	// ModRevision, ok true and a *CorruptError.
	ReadCluster(ctx context.Context) (info ClusterInfo, ok bool, err error)
	// WriteCluster writes rec if the record is at revision rev, or absent
	// when rev is 0, and returns the revision of the write. Otherwise it
	// writes nothing and returns a *ClusterConflictError holding the key as
	// found. An invalid rec fails with ErrInvalidArgument.
	WriteCluster(ctx context.Context, rec ClusterRecord, rev Revision) (Revision, error)
}
