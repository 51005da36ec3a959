package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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
	return json.Marshal(rec)
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
	); err != nil {
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
