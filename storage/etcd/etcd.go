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
// KeepAliveOnce, Verify, LeaseKeys, ReadShardStates and Ping do not go through the client's balancer,
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
// deadline conservative (see package lease). Renewals through a member
// reuse one keep-alive stream, one request at a time (a renewal that finds
// it busy opens a stream of its own): the etcd client logs in again
// whenever a stream is opened, if it has a user and password, and a
// login is a bcrypt check and a raft proposal on the server (about 70 ms
// of etcd's CPU each on a 2-core machine). The connections are closed by
// [Store.Close] or when the client is closed.
//
// # TLS and authentication
//
// The Store uses the client it is given, with its TLS and credentials;
// every key it touches is under "/{namespace}/", so a role granting
// readwrite on that prefix (and nothing else) is all it needs. etcd checks
// no permission to grant a lease; renewing and revoking one need write
// permission on every key attached to it. A refusal of the client's
// credentials or permissions is reported as [storage.ErrPermissionDenied]
// (a watch the server cancels for it too); [TranslateError] does the
// same for errors met outside a Store, such as clientv3.New's (a client
// with a user and password logs in when it is made). Make the client with
// [NewClient]: where clientv3.New says only "context deadline exceeded",
// it adds what a TLS handshake with each endpoint finds ([ProbeTLS]).
// SECURITY.md gives the etcdctl lines and what each misconfiguration does.
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
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	order          storage.StateOrder // the order keys of shard state writes (storage/stateorder.go)
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
func (s *Store) shardKey(sh sharding.ShardID) string { return s.prefix + storage.LockKey(sh) }
func (s *Store) checkpointKey(sh sharding.ShardID, name string) string {
	return s.prefix + storage.CheckpointKey(sh, name)
}

// ctx applies the default timeout when ctx has no earlier deadline.
func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return storage.WithOpTimeout(ctx, s.opTimeout)
}

// translate maps an etcd client error onto the storage sentinels.
func translate(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", classify(err), err)
}

// classify returns the storage sentinel for an etcd client error. Errors
// are matched by etcd's typed errors (rpctypes) and gRPC status codes,
// never by their text: a gRPC status the client did not convert (a watch
// cancelled by the server, for one) is converted by rpctypes.Error first.
func classify(err error) error {
	conv := err
	var se interface {
		error
		GRPCStatus() *status.Status
	}
	if errors.As(err, &se) {
		conv = rpctypes.Error(se)
	}
	is := func(targets ...error) bool {
		for _, t := range targets {
			if errors.Is(err, t) || errors.Is(conv, t) {
				return true
			}
		}
		return false
	}
	switch {
	case is(rpctypes.ErrLeaseNotFound):
		return storage.ErrLeaseNotFound
	case is(rpctypes.ErrCompacted):
		return storage.ErrCompacted
	case is(rpctypes.ErrTooManyOps, rpctypes.ErrDuplicateKey, rpctypes.ErrEmptyKey, rpctypes.ErrRequestTooLarge,
		rpctypes.ErrLeaseTTLTooLarge, rpctypes.ErrKeyNotFound):
		return storage.ErrInvalidArgument
	case is(rpctypes.ErrAuthOldRevision):
		// The roles changed while the request was checked: a retry is
		// checked against the new ones.
		return storage.ErrUnavailable
	case is(rpctypes.ErrPermissionDenied, rpctypes.ErrInvalidAuthToken, rpctypes.ErrAuthFailed,
		rpctypes.ErrInvalidAuthMgmt, rpctypes.ErrUserEmpty, rpctypes.ErrUserNotFound, rpctypes.ErrRoleNotGranted),
		se != nil && (se.GRPCStatus().Code() == codes.PermissionDenied || se.GRPCStatus().Code() == codes.Unauthenticated):
		return storage.ErrPermissionDenied
	default:
		// Timeouts, cancellation, transport and leader errors: nothing can
		// be concluded about the request.
		return storage.ErrUnavailable
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

// LeaseKeys implements storage.Leases: one hedged LeaseTimeToLive with
// the attached keys (etcd answers TTL -1 for a lease it does not know,
// 0 for one with less than a second left).
// Keys outside the namespace are left out.
func (s *Store) LeaseKeys(ctx context.Context, id storage.LeaseID) ([]string, error) {
	tctx, cancel := s.ctx(ctx)
	resp, err := hedged(tctx, s.members, s.attemptTimeout, func(ctx context.Context, m *member) (*pb.LeaseTimeToLiveResponse, error) {
		return m.lease.LeaseTimeToLive(clientv3.WithRequireLeader(ctx), &pb.LeaseTimeToLiveRequest{ID: int64(id), Keys: true})
	})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("keys of lease %x: %w", id, translate(err))
	}
	// The remaining TTL is in whole seconds, rounded down: 0 is a live
	// lease with less than a second left (a LeaseTTL of 1-2 s, or a
	// renewal late), -1 one that ended.
	if resp.TTL < 0 {
		return nil, fmt.Errorf("keys of lease %x: %w", id, storage.ErrLeaseNotFound)
	}
	keys := make([]string, 0, len(resp.Keys))
	for _, k := range resp.Keys {
		if rel, ok := strings.CutPrefix(string(k), s.prefix); ok {
			keys = append(keys, rel)
		}
	}
	return keys, nil
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

// TranslateError maps an error of the etcd client onto the storage
// sentinels as the Store's calls do: storage.ErrPermissionDenied for a
// refused login or permission, storage.ErrUnavailable for what says
// nothing about the request, and so on (nil stays nil). It is for errors
// met outside a Store, such as clientv3.New's: a client configured with a
// user and password logs in when it is made, so a wrong password fails
// there, with rpctypes.ErrAuthFailed.
func TranslateError(err error) error { return translate(err) }
