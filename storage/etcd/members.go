package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/shardhost/shardhost/storage"
)

// DefaultAttemptTimeout is how long a hedged call waits for one member
// before it also asks the next one (Config.AttemptTimeout).
const DefaultAttemptTimeout = 300 * time.Millisecond

// errClosed is returned by hedged calls after Close or after the client
// was closed.
var errClosed = errors.New("etcd store closed")

// member is one etcd endpoint reached through a connection of its own.
type member struct {
	endpoint string
	conn     *grpc.ClientConn
	lease    pb.LeaseClient
	kv       clientv3.KV // no retry policy: a failure returns at once

	// renewing is held (1-buffered) by the renewal using ka: one request
	// at a time on the keep-alive stream, so its reply answers it.
	renewing chan struct{}
	logsIn   bool // the client logs in (user and password) whenever a stream opens
	kaMu     sync.Mutex
	ka       *kaStream // the keep-alive stream, nil until the next renewal opens one
	opened   time.Time // when a keep-alive stream was last opened (logsIn)
}

// loginInterval bounds how often renewals through one member open a
// keep-alive stream when the client logs in whenever it opens one: each
// login costs the server a bcrypt check and a raft proposal, and on a
// starved server the logins of hedged attempts would keep it starved
// (measured: every runner detached and none re-attached).
const loginInterval = time.Second

// errLoginInterval fails a renewal attempt that would open a keep-alive
// stream (and log in) within loginInterval of the previous one through
// the same member. It says nothing about the request: another member may
// answer, or a later attempt.
var errLoginInterval = errors.New("keep-alive stream busy or lost, and one was opened (a login) less than a second ago")

// mayOpenStream reports whether a renewal may open a keep-alive stream
// now (and records it): always when the client does not log in per
// stream, else once per loginInterval.
func (m *member) mayOpenStream() bool {
	if !m.logsIn {
		return true
	}
	m.kaMu.Lock()
	defer m.kaMu.Unlock()
	now := time.Now()
	if !m.opened.IsZero() && now.Sub(m.opened) < loginInterval {
		return false
	}
	m.opened = now
	return true
}

// kaStream is a member's keep-alive stream, kept between renewals: opening
// a stream makes the etcd client log in again when it has a user and
// password (an Authenticate call, a bcrypt check and a raft proposal on
// the server), which a stream per renewal would pay every renewal.
type kaStream struct {
	stream pb.Lease_LeaseKeepAliveClient
	cancel context.CancelFunc
}

func newMember(endpoint string, conn *grpc.ClientConn, cli *clientv3.Client) *member {
	return &member{
		endpoint: endpoint, conn: conn,
		lease:    pb.NewLeaseClient(conn),
		kv:       clientv3.NewKVFromKVClient(pb.NewKVClient(conn), cli),
		renewing: make(chan struct{}, 1),
		logsIn:   cli.Username != "" && cli.Password != "",
	}
}

// close closes the member's connection (ending its keep-alive stream).
func (m *member) close() error {
	m.dropStream()
	return m.conn.Close()
}

// dropStream cancels the keep-alive stream, if any; the next renewal
// opens another.
func (m *member) dropStream() {
	m.kaMu.Lock()
	ka := m.ka
	m.ka = nil
	m.kaMu.Unlock()
	if ka != nil {
		ka.cancel()
	}
}

// members holds one connection per endpoint of the client, dialed on first
// use through the client (its TLS, credentials, keepalive and dial
// options). They carry only the calls that keep a runner attached
// (renewals, verifications, pings), so those never depend on the one
// connection the client's balancer happens to pick.
type members struct {
	cli *clientv3.Client

	mu        sync.Mutex
	list      []*member // in the client's endpoint order when dialed
	preferred string    // endpoint of the member that answered last
	closed    bool
	stop      func() bool // unregisters the close-with-the-client hook

	stats hedgeStats
}

// current returns the members for the client's current endpoints (dialing
// new ones, closing removed ones) and the index of the preferred member.
func (ms *members) current() ([]*member, int, error) {
	eps := ms.cli.Endpoints()
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.closed {
		return nil, 0, errClosed
	}
	if ms.stop == nil {
		if ctx := ms.cli.Ctx(); ctx != nil {
			ms.stop = context.AfterFunc(ctx, func() { _ = ms.close() })
		}
	}
	same := len(eps) == len(ms.list)
	for i := 0; same && i < len(eps); i++ {
		same = ms.list[i].endpoint == eps[i]
	}
	if !same {
		old := slices.Clone(ms.list)
		var list, dialed []*member
		for _, ep := range eps {
			if i := slices.IndexFunc(old, func(m *member) bool { return m.endpoint == ep }); i >= 0 {
				list = append(list, old[i])
				old = slices.Delete(old, i, i+1)
				continue
			}
			conn, err := ms.cli.Dial(ep) // does not wait for the connection
			if err != nil {
				for _, m := range dialed {
					_ = m.close()
				}
				return nil, 0, fmt.Errorf("dial %s: %w", ep, err)
			}
			m := newMember(ep, conn, ms.cli)
			list, dialed = append(list, m), append(dialed, m)
		}
		for _, m := range old { // endpoints the client no longer has
			_ = m.close()
		}
		ms.list = list
	}
	if len(ms.list) == 0 {
		return nil, 0, errors.New("client has no endpoints")
	}
	pref := max(slices.IndexFunc(ms.list, func(m *member) bool { return m.endpoint == ms.preferred }), 0)
	return ms.list, pref, nil
}

func (ms *members) answered(m *member) {
	ms.mu.Lock()
	ms.preferred = m.endpoint
	ms.mu.Unlock()
}

// close closes every member connection; later calls fail with errClosed.
func (ms *members) close() error {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.closed {
		return nil
	}
	ms.closed = true
	if ms.stop != nil {
		ms.stop()
	}
	var errs []error
	for _, m := range ms.list {
		errs = append(errs, m.close())
	}
	ms.list = nil
	return errors.Join(errs...)
}

// transient reports whether err says nothing about the request itself (a
// timeout, a lost or leaderless member, a closed connection), so that
// another member may answer it.
func transient(err error) bool {
	return errors.Is(translate(err), storage.ErrUnavailable)
}

type attempt[T any] struct {
	v   T
	err error
	m   *member
}

// hedged runs call through the members until one answers: first through
// the member that answered last; whenever no attempt has answered for
// attemptTimeout, or an attempt failed transiently while a member is still
// untried, the next attempt starts through the next member. Earlier
// attempts keep running (a slow member may still answer first), each until
// ctx ends. The first success or non-transient error is returned; when ctx
// ends first, the last transient error. Every attempt starts after hedged
// was called and has ended when it returns.
func hedged[T any](ctx context.Context, ms *members, attemptTimeout time.Duration, call func(context.Context, *member) (T, error)) (T, error) {
	list, first, err := ms.current()
	if err != nil {
		var zero T
		return zero, err
	}
	v, m, err := hedge(ctx, list, first, attemptTimeout, &ms.stats, call)
	if m != nil {
		ms.answered(m)
	}
	return v, err
}

// hedgeStats counts hedged calls.
type hedgeStats struct{ calls, attempts, hedged, failed atomic.Int64 }

// hedge is hedged on a given list of members, starting with list[first];
// it also returns the member that answered successfully (nil otherwise).
func hedge[T any](ctx context.Context, list []*member, first int, attemptTimeout time.Duration, stats *hedgeStats, call func(context.Context, *member) (T, error)) (T, *member, error) {
	var zero T
	stats.calls.Add(1)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel: attempts end promptly
	defer cancel()
	results := make(chan attempt[T])
	timer := time.NewTimer(attemptTimeout)
	defer timer.Stop()
	started, running := 0, 0
	launch := func() {
		m := list[(first+started)%len(list)]
		started++
		running++
		stats.attempts.Add(1)
		if started == 2 {
			stats.hedged.Add(1)
		}
		wg.Go(func() {
			v, err := call(ctx, m)
			select {
			case results <- attempt[T]{v, err, m}:
			case <-ctx.Done():
			}
		})
		timer.Reset(attemptTimeout)
	}
	launch()
	var last error
	for {
		select {
		case a := <-results:
			running--
			if a.err == nil {
				return a.v, a.m, nil
			}
			if !transient(a.err) {
				return a.v, nil, a.err
			}
			last = fmt.Errorf("through %s: %w", a.m.endpoint, a.err)
			if started < len(list) {
				launch() // an untried member: at once
			}
		case <-timer.C:
			launch()
		case <-ctx.Done():
			stats.failed.Add(1)
			if last == nil {
				last = ctx.Err()
			}
			return zero, nil, fmt.Errorf("%d attempts through %d members, none answered: %w", started, len(list), last)
		}
	}
}

// keepAliveOnce renews lease id once through m, on the member's
// keep-alive stream: one request at a time on it, so the reply is the
// answer to that request. A stream that fails, or whose call's ctx ends
// before the reply, is dropped; the next renewal opens a new one. A
// renewal that fails on a stream opened by an earlier one is tried once
// more on a new stream (same ctx): the old one may have broken meanwhile,
// or carry a token that expired or was revoked (opening a stream logs in
// again). While another renewal waits on the member's stream (a hedged
// call came back to this member: its leader may be gone), the renewal
// uses a stream of its own for this one request, as every renewal did
// before streams were kept: it must not queue behind a request that may
// never be answered. When the client logs in per stream (a user and
// password), a member opens at most one stream per loginInterval; an
// attempt that would open another fails at once (errLoginInterval).
func keepAliveOnce(ctx context.Context, m *member, id clientv3.LeaseID) (int64, error) {
	select {
	case m.renewing <- struct{}{}:
	default:
		if !m.mayOpenStream() {
			return 0, errLoginInterval
		}
		return keepAliveOwnStream(ctx, m, id)
	}
	defer func() { <-m.renewing }()
	m.kaMu.Lock()
	reused := m.ka != nil
	m.kaMu.Unlock()
	ttl, err := m.renew(ctx, id)
	if err != nil && reused && ctx.Err() == nil {
		ttl, err = m.renew(ctx, id)
	}
	return ttl, err
}

// keepAliveOwnStream renews lease id once through m on a stream opened
// for this request and closed after it.
func keepAliveOwnStream(ctx context.Context, m *member, id clientv3.LeaseID) (int64, error) {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel() // closes the stream
	stream, err := m.lease.LeaseKeepAlive(ctx)
	if err != nil {
		return 0, rpctypes.Error(err)
	}
	if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)}); err != nil {
		return 0, rpctypes.Error(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		return 0, rpctypes.Error(err)
	}
	if resp.TTL <= 0 {
		return 0, rpctypes.ErrLeaseNotFound
	}
	return resp.TTL, nil
}

// renew sends one keep-alive request on the member's stream (opening it
// if there is none) and waits for the reply. The caller holds m.renewing.
func (m *member) renew(ctx context.Context, id clientv3.LeaseID) (ttl int64, err error) {
	m.kaMu.Lock()
	ka := m.ka
	m.kaMu.Unlock()
	if ka == nil {
		if !m.mayOpenStream() {
			return 0, errLoginInterval
		}
		sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
		ka = &kaStream{cancel: cancel}
		// Opening the stream may log in first: bounded by ctx too.
		stop := context.AfterFunc(ctx, cancel)
		ka.stream, err = m.lease.LeaseKeepAlive(sctx)
		if !stop() && err == nil {
			err = ctx.Err()
		}
		if err != nil {
			cancel()
			return 0, rpctypes.Error(err)
		}
		m.kaMu.Lock()
		m.ka = ka
		m.kaMu.Unlock()
	}
	// A ctx that ends before the reply cancels the stream: its reply, if
	// it ever came, must not answer a later request.
	stop := context.AfterFunc(ctx, ka.cancel)
	var resp *pb.LeaseKeepAliveResponse
	err = ka.stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)})
	if err == nil {
		resp, err = ka.stream.Recv()
	}
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err == nil && resp.ID != int64(id) {
		err = fmt.Errorf("keep-alive stream answered lease %x for lease %x", resp.ID, int64(id))
	}
	if err != nil {
		m.kaMu.Lock()
		if m.ka == ka {
			m.ka = nil
		}
		m.kaMu.Unlock()
		ka.cancel()
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, rpctypes.Error(err)
	}
	if resp.TTL <= 0 {
		return 0, rpctypes.ErrLeaseNotFound
	}
	return resp.TTL, nil
}
