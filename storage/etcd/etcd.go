// Package etcd implements [storage.Store] on etcd v3 through
// go.etcd.io/etcd/client/v3. It is the only package of shardhost that
// imports the etcd client.
//
// Keys live under "/{namespace}/" with the layout of the design: runners/,
// shards/, handoffs/ and checkpoints/. A batched lock operation is one
// transaction of [storage.MaxShardsPerTxn] nested per-shard transactions, so
// "held elsewhere" is decided per shard inside one atomic request.
//
// # Calls that keep a runner attached
//
// KeepAliveOnce, Verify and Ping do not go through the client's balancer,
// which keeps sending some of the requests to a black-holed
// member until gRPC keepalive drops its connection, about 12 s later (see
// [ClientConfig]). The store dials one connection per endpoint of the
// client instead (with the client's TLS, credentials, keepalive and dial
// options) and hedges these calls across them: the first attempt goes
// through the member that answered last; whenever no attempt has answered
// for [Config.AttemptTimeout], or one failed for a reason that says nothing
// about the request (timeout, no leader, connection lost), the next attempt
// starts through the next member while the earlier ones keep running. The
// first answer wins; "lease not found" and other definite errors are
// answers too. All three are reads or renewals, safe to send more than
// once; every attempt is sent after the call began, which is what
// [storage.Leases.KeepAliveOnce] promises and what keeps the lease
// deadline conservative (see package lease). The connections are closed by
// [Store.Close] or when the client is closed.
//
// # Concurrency
//
// A Store is safe for concurrent use; the etcd client is shared without any
// lock. Every call runs under a context with a timeout ([Config.OpTimeout]
// when the caller's context has no earlier deadline).
package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

var _ storage.Store = (*Store)(nil)

// DefaultOpTimeout bounds a call whose context has no earlier deadline.
const DefaultOpTimeout = storage.DefaultOpTimeout

// Config holds the optional settings of a Store. Zero fields mean defaults.
type Config struct {
	// OpTimeout bounds each call whose context has no earlier deadline.
	// Default DefaultOpTimeout.
	OpTimeout time.Duration
	// AttemptTimeout is how long KeepAliveOnce, Verify and Ping wait for
	// an answer from one member before they also ask the next one (see
	// Store). Default DefaultAttemptTimeout (300 ms): a renewal's window
	// (2.5 s at the runner's defaults) holds 9 attempts, every member of a
	// 3-member cluster three times.
	AttemptTimeout time.Duration
}

// Store is a storage.Store on an etcd cluster. Renewals, verifications and
// pings are hedged across the members (see the package documentation).
type Store struct {
	cli            *clientv3.Client
	prefix         string // "/{namespace}/"
	opTimeout      time.Duration
	attemptTimeout time.Duration
	members        *members
}

// New returns a store that keeps its keys under "/{namespace}/" in the etcd
// cluster behind cli. The caller keeps ownership of cli and closes it after
// the store is no longer used; closing cli also closes the store's own
// member connections (dialed on first use, one per endpoint of cli).
func New(cli *clientv3.Client, namespace string, cfg Config) (*Store, error) {
	if cli == nil {
		return nil, fmt.Errorf("%w: nil etcd client", storage.ErrInvalidArgument)
	}
	if namespace == "" || strings.ContainsAny(namespace, "/\x00") {
		return nil, fmt.Errorf("%w: namespace %q: want a non-empty name without '/'", storage.ErrInvalidArgument, namespace)
	}
	if cfg.OpTimeout < 0 || cfg.AttemptTimeout < 0 {
		return nil, fmt.Errorf("%w: negative OpTimeout or AttemptTimeout", storage.ErrInvalidArgument)
	}
	if cfg.OpTimeout == 0 {
		cfg.OpTimeout = DefaultOpTimeout
	}
	if cfg.AttemptTimeout == 0 {
		cfg.AttemptTimeout = DefaultAttemptTimeout
	}
	return &Store{
		cli: cli, prefix: "/" + namespace + "/", opTimeout: cfg.OpTimeout,
		attemptTimeout: cfg.AttemptTimeout, members: &members{cli: cli},
	}, nil
}

// Close closes the store's member connections (see Store). It does not
// close the client, and it is not needed when the client is closed (that
// closes them too). The store must not be used afterwards.
func (s *Store) Close() error { return s.members.close() }

// Stats counts the hedged calls of a Store (KeepAliveOnce, Verify
// batches, Ping) since it was created.
type Stats struct {
	Calls    int64 // hedged calls
	Attempts int64 // attempts of those calls, one member each
	Hedged   int64 // calls that needed a second attempt
	Failed   int64 // calls no member answered before their context ended
}

// Stats returns the counts of the store's hedged calls.
func (s *Store) Stats() Stats {
	st := &s.members.stats
	return Stats{Calls: st.calls.Load(), Attempts: st.attempts.Load(), Hedged: st.hedged.Load(), Failed: st.failed.Load()}
}

// ClientConfig returns the etcd client settings shardhost recommends for
// endpoints: a 5 s dial timeout and gRPC keepalive pings every 10 s (gRPC
// never pings more often) with a 2 s timeout. Pings are sent only while
// streams are open (a runner always has its watches open): etcd answers
// pings on idle connections with GOAWAY "too_many_pings".
//
// Measured with these settings (3 members on loopback, one toxiproxy proxy
// in front of each, etcd v3.6.16; TestClientConfigDropsBlackholedMember
// and runner's TestEtcdFault* tests, BENCHMARKS.md):
//
//   - With one member black-holed, the client's balancer kept sending
//     requests to it for 11.7-11.8 s (4 runs; of Gets with a 500 ms
//     timeout, one every 50 ms, 18 hung each time) until keepalive dropped
//     the connection; each of those requests hung until its own deadline,
//     and watches on that connection stalled without an error. That is far
//     longer than a renewal may take at the runner's defaults (2.5 s from
//     its send to the detach instant), so a Store does not depend on it:
//     renewals, verifications and pings go through a connection per
//     member, hedged (see the package documentation). The remaining calls
//     through the balancer (acquire, release, handoffs, listings) fail by
//     their deadline and are retried; three consecutive failures of one
//     kind detach a runner (runner.Config.StorageErrorThreshold).
//   - With that, three runners at the default configuration stayed
//     attached, and no ask failed, through one member black-holed for 60 s,
//     1 s of latency on one member for 60 s, the leader killed, and the
//     leader paused for 3 s and for 10 s (10 runs each). The one exception
//     is etcd's: a leader paused for longer than the TTL revoked, as it
//     resumed, the leases the new leader kept alive, after 4 of the 10
//     ten-second pauses (see runner.Config.LeaseTTL).
func ClientConfig(endpoints []string) clientv3.Config {
	return clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
	}
}

func (s *Store) key(ks storage.Keyspace, name string) string {
	return s.prefix + storage.Key(ks, name)
}
func (s *Store) shardKey(sh sharding.ShardID) string   { return s.prefix + storage.LockKey(sh) }
func (s *Store) handoffKey(sh sharding.ShardID) string { return s.prefix + storage.HandoffKey(sh) }
func (s *Store) checkpointKey(sh sharding.ShardID, name string) string {
	return s.prefix + storage.CheckpointKey(sh, name)
}

// ctx applies the default timeout when ctx has no earlier deadline.
func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return storage.WithOpTimeout(ctx, s.opTimeout)
}

// translate maps an etcd client error onto the storage sentinels.
func translate(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return fmt.Errorf("%w: %w", storage.ErrLeaseNotFound, err)
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("%w: %w", storage.ErrCompacted, err)
	case errors.Is(err, rpctypes.ErrTooManyOps), errors.Is(err, rpctypes.ErrDuplicateKey),
		errors.Is(err, rpctypes.ErrEmptyKey), errors.Is(err, rpctypes.ErrRequestTooLarge),
		errors.Is(err, rpctypes.ErrLeaseTTLTooLarge), errors.Is(err, rpctypes.ErrKeyNotFound):
		return fmt.Errorf("%w: %w", storage.ErrInvalidArgument, err)
	case errors.Is(err, rpctypes.ErrPermissionDenied), errors.Is(err, rpctypes.ErrInvalidAuthToken),
		errors.Is(err, rpctypes.ErrAuthFailed), errors.Is(err, rpctypes.ErrInvalidAuthMgmt),
		errors.Is(err, rpctypes.ErrUserEmpty), errors.Is(err, rpctypes.ErrAuthOldRevision):
		return fmt.Errorf("%w: %w", storage.ErrPermissionDenied, err)
	default:
		// Timeouts, cancellation, transport and leader errors: nothing can
		// be concluded about the request.
		return fmt.Errorf("%w: %w", storage.ErrUnavailable, err)
	}
}

func keyValue(kv *mvccpb.KeyValue, prefixLen int) storage.KeyValue {
	return storage.KeyValue{
		Key:            string(kv.Key[prefixLen:]),
		Value:          kv.Value,
		Lease:          storage.LeaseID(kv.Lease),
		CreateRevision: storage.Revision(kv.CreateRevision),
		ModRevision:    storage.Revision(kv.ModRevision),
	}
}

func (s *Store) lockOf(kv *mvccpb.KeyValue) storage.Lock {
	l, _ := storage.DecodeLock(keyValue(kv, len(s.key(storage.KeyspaceShards, ""))))
	return l
}

// Grant implements storage.Leases.
func (s *Store) Grant(ctx context.Context, ttl time.Duration) (storage.Lease, error) {
	if err := storage.CheckTTL(ttl); err != nil {
		return storage.Lease{}, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	secs := int64((ttl + time.Second - 1) / time.Second)
	resp, err := s.cli.Grant(ctx, secs)
	if err != nil {
		return storage.Lease{}, fmt.Errorf("grant lease: %w", translate(err))
	}
	return storage.Lease{ID: storage.LeaseID(resp.ID), TTL: time.Duration(resp.TTL) * time.Second}, nil
}

// KeepAliveOnce implements storage.Leases.
func (s *Store) KeepAliveOnce(ctx context.Context, id storage.LeaseID) (time.Duration, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	ttl, err := hedged(ctx, s.members, s.attemptTimeout, func(ctx context.Context, m *member) (int64, error) {
		return keepAliveOnce(ctx, m, clientv3.LeaseID(id))
	})
	if err != nil {
		return 0, fmt.Errorf("keep-alive lease %x: %w", id, translate(err))
	}
	return time.Duration(ttl) * time.Second, nil
}

// Revoke implements storage.Leases.
func (s *Store) Revoke(ctx context.Context, id storage.LeaseID) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if _, err := s.cli.Revoke(ctx, clientv3.LeaseID(id)); err != nil {
		return fmt.Errorf("revoke lease %x: %w", id, translate(err))
	}
	return nil
}

// PutRunner implements storage.Registry.
func (s *Store) PutRunner(ctx context.Context, lease storage.LeaseID, rec storage.RunnerRecord) (storage.Revision, error) {
	val, err := storage.EncodeRunner(rec)
	if err != nil {
		return 0, err
	}
	if err := storage.CheckLease(lease); err != nil {
		return 0, err
	}
	key := s.key(storage.KeyspaceRunners, rec.ID)
	put := clientv3.OpPut(key, string(val), clientv3.WithLease(clientv3.LeaseID(lease)))
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	// Attached to our lease, else absent (a missing key's lease compares
	// as 0, hence the lease check above).
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", clientv3.LeaseID(lease))).Then(put).Else(
		clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
			[]clientv3.Op{put},
			[]clientv3.Op{clientv3.OpGet(key)}),
	).Commit()
	if err != nil {
		return 0, fmt.Errorf("put runner %q: %w", rec.ID, translate(err))
	}
	if !resp.Succeeded {
		nested := (*clientv3.TxnResponse)(resp.Responses[0].GetResponseTxn())
		if !nested.Succeeded {
			return 0, s.runnerConflict(rec.ID, firstKV(nested))
		}
	}
	return storage.Revision(resp.Header.Revision), nil
}

// ReplaceRunner implements storage.Registry.
func (s *Store) ReplaceRunner(ctx context.Context, lease storage.LeaseID, rec storage.RunnerRecord, rev storage.Revision) (storage.Revision, error) {
	val, err := storage.EncodeRunner(rec)
	if err != nil {
		return 0, err
	}
	if err := errors.Join(storage.CheckLease(lease), storage.CheckRevision(rev)); err != nil {
		return 0, err
	}
	key := s.key(storage.KeyspaceRunners, rec.ID)
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", int64(rev))).
		Then(clientv3.OpPut(key, string(val), clientv3.WithLease(clientv3.LeaseID(lease)))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return 0, fmt.Errorf("replace runner %q: %w", rec.ID, translate(err))
	}
	if !resp.Succeeded {
		return 0, s.runnerConflict(rec.ID, firstKV(resp))
	}
	return storage.Revision(resp.Header.Revision), nil
}

func (s *Store) runnerConflict(id string, kv *mvccpb.KeyValue) error {
	ce := &storage.RunnerConflictError{ID: id, Exists: kv != nil}
	if kv != nil {
		ce.Existing = keyValue(kv, len(s.key(storage.KeyspaceRunners, "")))
	}
	return ce
}

// batchTxn runs one transaction whose Then holds one nested op per shard of
// shards[lo:hi] and returns the nested responses and the revision.
func (s *Store) batchTxn(ctx context.Context, ops []clientv3.Op) ([]*clientv3.TxnResponse, storage.Revision, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, 0, translate(err)
	}
	out := make([]*clientv3.TxnResponse, len(resp.Responses))
	for i, r := range resp.Responses {
		t := r.GetResponseTxn()
		if t == nil {
			return nil, 0, fmt.Errorf("%w: nested response %d is not a txn", storage.ErrUnavailable, i)
		}
		out[i] = (*clientv3.TxnResponse)(t)
	}
	return out, storage.Revision(resp.Header.Revision), nil
}

// firstKV returns the key read by the first operation of r, or nil.
func firstKV(r *clientv3.TxnResponse) *mvccpb.KeyValue {
	if len(r.Responses) == 0 {
		return nil
	}
	return rangeKV(r.Responses[0])
}

// prevKV returns the previous key of the put of a succeeded per-shard
// transaction (see putLockOps), or nil when the key was absent.
func prevKV(r *clientv3.TxnResponse) *mvccpb.KeyValue {
	if len(r.Responses) == 0 {
		return nil
	}
	if pr := r.Responses[0].GetResponsePut(); pr != nil {
		return pr.PrevKv
	}
	return nil
}

// rangeKV returns the first key of a range response, or nil.
func rangeKV(op *etcdserverpb.ResponseOp) *mvccpb.KeyValue {
	if rr := op.GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
		return rr.Kvs[0]
	}
	return nil
}

// putLockOps returns, per shard, a transaction that puts the lock under
// lease if cmp(key) holds, else reads the lock.
func (s *Store) putLockOps(lease storage.LeaseID, val []byte, shards []sharding.ShardID, cmp func(key string) clientv3.Cmp) []clientv3.Op {
	v := string(val)
	ops := make([]clientv3.Op, len(shards))
	for i, sh := range shards {
		key := s.shardKey(sh)
		ops[i] = clientv3.OpTxn(
			[]clientv3.Cmp{cmp(key)},
			[]clientv3.Op{clientv3.OpPut(key, v, clientv3.WithLease(clientv3.LeaseID(lease)), clientv3.WithPrevKV())},
			[]clientv3.Op{clientv3.OpGet(key)})
	}
	return ops
}

// batchParallelism is how many batch transactions of one call are in flight
// at once: etcd commits concurrent requests in one raft entry and fsync, so
// a 4096-shard acquire takes a few round trips instead of 64.
const batchParallelism = 8

// forBatches calls fn for each [lo, hi) batch of n items, up to
// batchParallelism at a time, and returns the first error (the other
// batches still complete: each is atomic on its own).
func forBatches(n int, fn func(lo, hi int) error) error {
	batches := storage.Batches(n, storage.MaxShardsPerTxn)
	if len(batches) == 1 {
		return fn(batches[0][0], batches[0][1])
	}
	errs := make([]error, len(batches))
	sem := make(chan struct{}, batchParallelism)
	var wg sync.WaitGroup
	for i, b := range batches {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = fn(b[0], b[1])
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Acquire implements storage.Locks.
func (s *Store) Acquire(ctx context.Context, lease storage.LeaseID, owner storage.Owner, shards []sharding.ShardID) ([]storage.AcquireResult, error) {
	val, err := storage.EncodeOwner(owner)
	if err != nil {
		return nil, err
	}
	if err := storage.CheckShardsFor(lease, shards); err != nil {
		return nil, err
	}
	out := make([]storage.AcquireResult, len(shards))
	err = forBatches(len(shards), func(lo, hi int) error {
		batch := shards[lo:hi]
		ops := s.putLockOps(lease, val, batch, func(key string) clientv3.Cmp {
			// Absent or without a lease: a missing key's lease compares as 0.
			return clientv3.Compare(clientv3.LeaseValue(key), "=", clientv3.NoLease)
		})
		resps, rev, err := s.batchTxn(ctx, ops)
		if err != nil {
			return err
		}
		for i, r := range resps {
			res := storage.AcquireResult{Shard: batch[i]}
			kv := firstKV(r)
			switch {
			case r.Succeeded:
				res.Status, res.Epoch = storage.Acquired, storage.Epoch(rev)
				if prev := prevKV(r); prev != nil {
					replaced := s.lockOf(prev)
					res.Replaced = &replaced
				}
			case kv != nil && storage.LeaseID(kv.Lease) == lease:
				res.Status, res.Epoch = storage.AlreadyOwned, storage.Epoch(kv.ModRevision)
			case kv != nil:
				res.Status, res.Holder = storage.HeldElsewhere, s.lockOf(kv)
			default:
				return fmt.Errorf("shard %d: %w: lock neither created nor found", batch[i], storage.ErrUnavailable)
			}
			out[lo+i] = res
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("acquire %d shards: %w", len(shards), err)
	}
	return out, nil
}

// Verify implements storage.Locks: one read-only transaction per batch that
// compares lease and ModRevision of every lock and returns no reads on the
// healthy path.
func (s *Store) Verify(ctx context.Context, lease storage.LeaseID, held []storage.Held) ([]storage.LostLock, error) {
	if err := storage.CheckHeldBy(lease, held); err != nil {
		return nil, err
	}
	perBatch := make([][]storage.LostLock, len(storage.Batches(len(held), storage.MaxShardsPerTxn)))
	err := forBatches(len(held), func(lo, hi int) error {
		batch := held[lo:hi]
		cmps := make([]clientv3.Cmp, 0, 2*len(batch))
		gets := make([]clientv3.Op, len(batch))
		for i, h := range batch {
			key := s.shardKey(h.Shard)
			cmps = append(cmps,
				clientv3.Compare(clientv3.LeaseValue(key), "=", clientv3.LeaseID(lease)),
				clientv3.Compare(clientv3.ModRevision(key), "=", int64(h.Epoch)))
			gets[i] = clientv3.OpGet(key)
		}
		tctx, cancel := s.ctx(ctx)
		resp, err := hedged(tctx, s.members, s.attemptTimeout, func(ctx context.Context, m *member) (*clientv3.TxnResponse, error) {
			return m.kv.Txn(clientv3.WithRequireLeader(ctx)).If(cmps...).Else(gets...).Commit()
		})
		cancel()
		if err != nil {
			return translate(err)
		}
		if resp.Succeeded {
			return nil
		}
		lost := &perBatch[lo/storage.MaxShardsPerTxn]
		for i, h := range batch {
			kv := rangeKV(resp.Responses[i])
			switch {
			case kv == nil:
				*lost = append(*lost, storage.LostLock{Shard: h.Shard})
			case storage.LeaseID(kv.Lease) != lease || storage.Epoch(kv.ModRevision) != h.Epoch:
				*lost = append(*lost, storage.LostLock{Shard: h.Shard, Exists: true, Holder: s.lockOf(kv)})
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("verify %d locks: %w", len(held), err)
	}
	return slices.Concat(perBatch...), nil
}

// Release implements storage.Locks.
func (s *Store) Release(ctx context.Context, lease storage.LeaseID, held []storage.Held) ([]sharding.ShardID, error) {
	if err := storage.CheckHeldBy(lease, held); err != nil {
		return nil, err
	}
	done := make([]bool, len(held))
	err := forBatches(len(held), func(lo, hi int) error {
		batch := held[lo:hi]
		ops := make([]clientv3.Op, len(batch))
		for i, h := range batch {
			key := s.shardKey(h.Shard)
			ops[i] = clientv3.OpTxn(
				[]clientv3.Cmp{
					clientv3.Compare(clientv3.LeaseValue(key), "=", clientv3.LeaseID(lease)),
					clientv3.Compare(clientv3.ModRevision(key), "=", int64(h.Epoch)),
				},
				[]clientv3.Op{clientv3.OpDelete(key)}, nil)
		}
		resps, _, err := s.batchTxn(ctx, ops)
		if err != nil {
			return err
		}
		for i, r := range resps {
			done[lo+i] = r.Succeeded
		}
		return nil
	})
	var released []sharding.ShardID
	for i, ok := range done {
		if ok {
			released = append(released, held[i].Shard)
		}
	}
	if err != nil {
		return released, fmt.Errorf("release %d shards: %w", len(held), err)
	}
	return released, nil
}

// Rewrite implements storage.Locks.
func (s *Store) Rewrite(ctx context.Context, lease storage.LeaseID, owner storage.Owner, shards []sharding.ShardID) ([]storage.AcquireResult, error) {
	val, err := storage.EncodeOwner(owner)
	if err != nil {
		return nil, err
	}
	if err := storage.CheckShardsFor(lease, shards); err != nil {
		return nil, err
	}
	out := make([]storage.AcquireResult, len(shards)) // Status 0: absent, dropped below
	err = forBatches(len(shards), func(lo, hi int) error {
		batch := shards[lo:hi]
		ops := s.putLockOps(lease, val, batch, func(key string) clientv3.Cmp {
			return clientv3.Compare(clientv3.LeaseValue(key), "=", clientv3.LeaseID(lease)) // ours
		})
		resps, rev, err := s.batchTxn(ctx, ops)
		if err != nil {
			return err
		}
		for i, r := range resps {
			if r.Succeeded {
				out[lo+i] = storage.AcquireResult{Shard: batch[i], Status: storage.Acquired, Epoch: storage.Epoch(rev)}
			} else if kv := firstKV(r); kv != nil {
				out[lo+i] = storage.AcquireResult{Shard: batch[i], Status: storage.HeldElsewhere, Holder: s.lockOf(kv)}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rewrite %d locks: %w", len(shards), err)
	}
	return slices.DeleteFunc(out, func(r storage.AcquireResult) bool { return r.Status == 0 }), nil
}

// Transfer implements storage.Locks: per shard, a nested transaction that
// moves the lock and deletes the handoff record if the lock is the
// caller's at FromEpoch and the record the target's, else reads both.
func (s *Store) Transfer(ctx context.Context, reqs []storage.TransferRequest) ([]storage.TransferResult, error) {
	if err := storage.CheckTransfers(reqs); err != nil {
		return nil, err
	}
	vals := make([]string, len(reqs))
	for i, req := range reqs {
		v, err := storage.EncodeOwner(req.ToOwner)
		if err != nil {
			return nil, err
		}
		vals[i] = string(v)
	}
	out := make([]storage.TransferResult, len(reqs))
	err := forBatches(len(reqs), func(lo, hi int) error {
		ops := make([]clientv3.Op, 0, hi-lo)
		for i := lo; i < hi; i++ {
			req := reqs[i]
			sk, hk := s.shardKey(req.Shard), s.handoffKey(req.Shard)
			cmps := []clientv3.Cmp{
				clientv3.Compare(clientv3.LeaseValue(sk), "=", clientv3.LeaseID(req.FromLease)),
				clientv3.Compare(clientv3.ModRevision(sk), "=", int64(req.FromEpoch)),
				clientv3.Compare(clientv3.LeaseValue(hk), "=", clientv3.LeaseID(req.ToLease)),
			}
			if req.HandoffRevision != 0 {
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(hk), "=", int64(req.HandoffRevision)))
			}
			ops = append(ops, clientv3.OpTxn(cmps,
				[]clientv3.Op{clientv3.OpPut(sk, vals[i], clientv3.WithLease(clientv3.LeaseID(req.ToLease))), clientv3.OpDelete(hk)},
				[]clientv3.Op{clientv3.OpGet(sk)}))
		}
		resps, rev, err := s.batchTxn(ctx, ops)
		if err != nil {
			err = fmt.Errorf("transfer %d shards: %w", hi-lo, err)
			for i := lo; i < hi; i++ {
				out[i] = storage.TransferResult{Shard: reqs[i].Shard, Err: err}
			}
			return err
		}
		for k, r := range resps {
			req := reqs[lo+k]
			res := storage.TransferResult{Shard: req.Shard}
			switch kv := firstKV(r); {
			case r.Succeeded:
				res.Epoch = storage.Epoch(rev)
			case kv == nil || storage.LeaseID(kv.Lease) != req.FromLease || storage.Epoch(kv.ModRevision) != req.FromEpoch:
				res.Err = fmt.Errorf("transfer shard %d: %w", req.Shard, storage.ErrNotOwner)
			default:
				res.Err = fmt.Errorf("transfer shard %d: %w", req.Shard, storage.ErrNoHandoff)
			}
			out[lo+k] = res
		}
		return nil
	})
	return out, err
}

// PutHandoffs implements storage.Handoffs: per record, a nested
// transaction that creates the key if absent, else updates it if it is
// under lease, else reads it (a conflict).
func (s *Store) PutHandoffs(ctx context.Context, lease storage.LeaseID, puts []storage.HandoffPut) ([]storage.HandoffResult, error) {
	vals, err := storage.EncodeHandoffs(lease, puts)
	if err != nil {
		return nil, err
	}
	out := make([]storage.HandoffResult, len(puts))
	err = forBatches(len(puts), func(lo, hi int) error {
		ops := make([]clientv3.Op, 0, hi-lo)
		for i := lo; i < hi; i++ {
			hk := s.handoffKey(puts[i].Shard)
			put := clientv3.OpPut(hk, string(vals[i]), clientv3.WithLease(clientv3.LeaseID(lease)))
			ops = append(ops, clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(hk), "=", 0)},
				[]clientv3.Op{put},
				[]clientv3.Op{clientv3.OpTxn(
					[]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(hk), "=", clientv3.LeaseID(lease))},
					[]clientv3.Op{put},
					[]clientv3.Op{clientv3.OpGet(hk)})}))
		}
		resps, rev, err := s.batchTxn(ctx, ops)
		if err != nil {
			err = fmt.Errorf("put %d handoff records: %w", hi-lo, err)
			for i := lo; i < hi; i++ {
				out[i] = storage.HandoffResult{Shard: puts[i].Shard, Err: err}
			}
			return err
		}
		for k, r := range resps {
			res := storage.HandoffResult{Shard: puts[lo+k].Shard, Revision: rev}
			if !r.Succeeded {
				if nested := r.Responses[0].GetResponseTxn(); nested != nil && !nested.Succeeded {
					e := &storage.HandoffConflictError{Shard: res.Shard}
					if kv := firstKV((*clientv3.TxnResponse)(nested)); kv != nil {
						e.Existing, _ = storage.DecodeHandoff(keyValue(kv, len(s.key(storage.KeyspaceHandoffs, ""))))
					}
					res.Revision, res.Err = 0, e
				}
			}
			out[lo+k] = res
		}
		return nil
	})
	return out, err
}

// DeleteHandoffs implements storage.Handoffs.
func (s *Store) DeleteHandoffs(ctx context.Context, lease storage.LeaseID, shards []sharding.ShardID) ([]sharding.ShardID, error) {
	if err := storage.CheckShardsFor(lease, shards); err != nil {
		return nil, err
	}
	deleted := make([]bool, len(shards))
	err := forBatches(len(shards), func(lo, hi int) error {
		ops := make([]clientv3.Op, 0, hi-lo)
		for _, sh := range shards[lo:hi] {
			hk := s.handoffKey(sh)
			ops = append(ops, clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(hk), "=", clientv3.LeaseID(lease))},
				[]clientv3.Op{clientv3.OpDelete(hk)}, nil))
		}
		resps, _, err := s.batchTxn(ctx, ops)
		if err != nil {
			return err
		}
		for k, r := range resps {
			deleted[lo+k] = r.Succeeded
		}
		return nil
	})
	var out []sharding.ShardID
	for i, ok := range deleted {
		if ok {
			out = append(out, shards[i])
		}
	}
	if err != nil {
		return out, fmt.Errorf("delete %d handoff records: %w", len(shards), err)
	}
	return out, nil
}

// WriteCheckpoint implements storage.Checkpoints.
func (s *Store) WriteCheckpoint(ctx context.Context, shard sharding.ShardID, name string, epoch storage.Epoch, data []byte) (storage.Revision, error) {
	if err := storage.CheckEpoch(shard, epoch); err != nil {
		return 0, err
	}
	sk := s.shardKey(shard)
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(sk), "=", int64(epoch))).
		Then(clientv3.OpPut(s.checkpointKey(shard, name), string(storage.EncodeCheckpoint(epoch, data)))).
		Else(clientv3.OpGet(sk)).Commit()
	if err != nil {
		return 0, fmt.Errorf("write checkpoint of shard %d: %w", shard, translate(err))
	}
	if !resp.Succeeded {
		fe := &storage.FencedError{Shard: shard, Epoch: epoch}
		if kv := firstKV(resp); kv != nil {
			fe.Current = storage.Epoch(kv.ModRevision)
		}
		return 0, fe
	}
	return storage.Revision(resp.Header.Revision), nil
}

// ReadCheckpoint implements storage.Checkpoints.
func (s *Store) ReadCheckpoint(ctx context.Context, shard sharding.ShardID, name string) (storage.Checkpoint, bool, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.checkpointKey(shard, name))
	if err != nil {
		return storage.Checkpoint{}, false, fmt.Errorf("read checkpoint of shard %d: %w", shard, translate(err))
	}
	if len(resp.Kvs) == 0 {
		return storage.Checkpoint{}, false, nil
	}
	cp, err := storage.DecodeCheckpoint(shard, name, resp.Kvs[0].Value, storage.Revision(resp.Kvs[0].ModRevision))
	return cp, err == nil, err
}

// Ping implements storage.Store with a linearizable read of one key,
// hedged across the members like KeepAliveOnce.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	_, err := hedged(ctx, s.members, s.attemptTimeout, func(ctx context.Context, m *member) (*clientv3.GetResponse, error) {
		return m.kv.Get(clientv3.WithRequireLeader(ctx), s.prefix+"ping", clientv3.WithCountOnly())
	})
	if err != nil {
		return fmt.Errorf("ping: %w", translate(err))
	}
	return nil
}

// List implements storage.Lister.
func (s *Store) List(ctx context.Context, ks storage.Keyspace) (storage.Snapshot, error) {
	prefix := s.key(ks, "")
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return storage.Snapshot{}, fmt.Errorf("list %s: %w", ks, translate(err))
	}
	snap := storage.Snapshot{Revision: storage.Revision(resp.Header.Revision), KVs: make([]storage.KeyValue, len(resp.Kvs))}
	for i, kv := range resp.Kvs {
		snap.KVs[i] = keyValue(kv, len(prefix))
	}
	return snap, nil
}

// Watch implements storage.Lister. The watch requires a leader: if the
// member it is connected to loses its leader, the watch fails with
// storage.ErrUnavailable instead of stalling.
func (s *Store) Watch(ctx context.Context, ks storage.Keyspace, from storage.Revision) <-chan storage.WatchResponse {
	out := make(chan storage.WatchResponse)
	prefix := s.key(ks, "")
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := s.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(int64(from)))
	go func() {
		defer close(out)
		defer cancel()
		send := func(r storage.WatchResponse) bool {
			select {
			case out <- r:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for wr := range wch {
			if err := wr.Err(); err != nil {
				if wr.CompactRevision != 0 {
					err = fmt.Errorf("watch %s from %d: %w (compacted at %d)", ks, from, storage.ErrCompacted, wr.CompactRevision)
				} else {
					err = fmt.Errorf("watch %s: %w", ks, translate(err))
				}
				send(storage.WatchResponse{Err: err})
				return
			}
			if len(wr.Events) == 0 {
				continue
			}
			evs := make([]storage.Event, len(wr.Events))
			for i, ev := range wr.Events {
				evs[i].KV = keyValue(ev.Kv, len(prefix))
				if ev.Type == mvccpb.DELETE {
					evs[i].Type = storage.EventDelete
				} else {
					evs[i].Type = storage.EventPut
				}
			}
			if !send(storage.WatchResponse{Events: evs}) {
				return
			}
		}
		if ctx.Err() == nil {
			send(storage.WatchResponse{Err: fmt.Errorf("watch %s: %w: watch channel closed", ks, storage.ErrUnavailable)})
		}
	}()
	return out
}
