package registration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/shardhost/shardhost/storage"
)

// ErrClusterMismatch: the runner's configuration disagrees with the
// cluster record. Package runner re-exports it.
var ErrClusterMismatch = errors.New("runner: configuration differs from the cluster's")

// ClusterMismatchError reports a setting of this runner that differs from
// the one the cluster record holds (NumShards, Strategy, the coordination
// layout of its version: storage.Layout). Package runner re-exports it.
type ClusterMismatchError struct {
	Setting   string // "NumShards", "Strategy" or "coordination layout"
	Cluster   string // the cluster's value
	Runner    string // this runner's value
	WrittenBy string // the runner that published the cluster's value ("" if unknown)
}

func (e *ClusterMismatchError) Error() string {
	by := ""
	if e.WrittenBy != "" {
		by = fmt.Sprintf(" (published by runner %q)", e.WrittenBy)
	}
	return fmt.Sprintf("runner: %s mismatch: the cluster uses %s%s, this runner is configured with %s; "+
		"every runner of a cluster must agree (to change it, stop every runner and delete the cluster record)",
		e.Setting, e.Cluster, by, e.Runner)
}

// Is makes errors.Is(err, ErrClusterMismatch) true.
func (e *ClusterMismatchError) Is(target error) bool { return target == ErrClusterMismatch }

// ClusterStore is the part of storage.Store the cluster record is read
// and written with.
type ClusterStore interface {
	ReadCluster(ctx context.Context) (storage.ClusterInfo, bool, error)
	WriteCluster(ctx context.Context, rec storage.ClusterRecord, rev storage.Revision) (storage.Revision, error)
}

// CheckCluster compares want — the runner's NumShards and, for a hosting
// runner, its Strategy — with the cluster record. It publishes the record
// when there is none, adds the strategy when a client-only runner
// published it without one, and replaces a record that does not decode
// (WARN); all writes are conditional on the revision read. It returns the
// record as it stands after the check (a client-only runner learns the
// cluster's strategy from it; Strategy "" when no hosting runner
// published one yet), and a *ClusterMismatchError on a disagreement, or
// the store's error.
func CheckCluster(ctx context.Context, store ClusterStore, want storage.ClusterRecord, log *slog.Logger) (storage.ClusterRecord, error) {
	for range 3 { // the record may change under us; each write is conditional
		info, ok, err := store.ReadCluster(ctx)
		var corrupt *storage.CorruptError
		switch {
		case errors.As(err, &corrupt) && ok:
			log.Warn("replacing a damaged cluster record", "key", storage.ClusterKey, "err", err)
			err = writeCluster(ctx, store, want, info.ModRevision)
		case err != nil:
			return storage.ClusterRecord{}, fmt.Errorf("read the cluster record: %w", err)
		case !ok:
			if err = writeCluster(ctx, store, want, 0); err == nil {
				log.Info("published the cluster record", "key", storage.ClusterKey, "shards", want.NumShards, "strategy", want.Strategy)
			}
		case info.NumShards != want.NumShards:
			return storage.ClusterRecord{}, &ClusterMismatchError{Setting: "NumShards", Cluster: fmt.Sprint(info.NumShards), Runner: fmt.Sprint(want.NumShards), WrittenBy: info.WrittenBy}
		case info.Layout != 0 && info.Layout != want.Layout:
			return storage.ClusterRecord{}, &ClusterMismatchError{Setting: "coordination layout", Cluster: layoutName(info.Layout), Runner: layoutName(want.Layout), WrittenBy: info.WrittenBy}
		case want.Strategy == "" || info.Strategy == want.Strategy:
			return info.ClusterRecord, nil
		case info.Strategy != "":
			return storage.ClusterRecord{}, &ClusterMismatchError{Setting: "Strategy", Cluster: fmt.Sprintf("%q", info.Strategy), Runner: fmt.Sprintf("%q", want.Strategy), WrittenBy: info.WrittenBy}
		default: // published by a client-only runner: add the strategy
			err = writeCluster(ctx, store, want, info.ModRevision)
		}
		if !errors.Is(err, storage.ErrClusterConflict) {
			return want, err
		}
	}
	return storage.ClusterRecord{}, fmt.Errorf("the cluster record %s keeps changing", storage.ClusterKey)
}

func writeCluster(ctx context.Context, store ClusterStore, rec storage.ClusterRecord, rev storage.Revision) error {
	if _, err := store.WriteCluster(ctx, rec, rev); err != nil {
		return fmt.Errorf("write the cluster record: %w", err)
	}
	return nil
}

// layoutName describes coordination layout n for a ClusterMismatchError.
func layoutName(n int) string {
	switch n {
	case 1:
		return "layout 1 (every runner watches every shard lock: an older version)"
	case storage.Layout:
		return fmt.Sprintf("layout %d (each runner watches its own keys)", n)
	default:
		return fmt.Sprintf("layout %d (another version)", n)
	}
}
