package runner

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Errors of remote delivery.
var (
	// ErrMessageTooLarge: a request or response exceeds MaxMessageSize.
	// A too-large request is never sent.
	ErrMessageTooLarge = errors.New("runner: message too large")
	// ErrMaybeDelivered: the connection to the owner failed after the
	// message was sent; the handler may or may not have run. Not retried.
	ErrMaybeDelivered = errors.New("runner: message may have been delivered")
	// ErrNotSent: the owner could not be reached before sending (no
	// connection). Retried until the caller's context ends.
	ErrNotSent = errors.New("runner: owner unreachable; message not sent")
	// ErrTooManyWaiting: MaxWaitingSends sends already wait for an owner.
	ErrTooManyWaiting = errors.New("runner: too many sends waiting for an owner")
)

// RemoteError is a handler error that came back from another runner: only
// its message survives the wire.
type RemoteError struct {
	Runner  string // the runner the handler ran on
	Message string
}

func (e *RemoteError) Error() string { return e.Message }

const deliverMethod = "/shardhost.v1.Runner/Deliver"

// transportServer is the gRPC service of a runner.
type transportServer interface {
	serveDeliver(ctx context.Context, req *deliverRequest) (*deliverResponse, func())
	serveHot(req *hotRequest) *hotResponse
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: "shardhost.v1.Runner",
	HandlerType: (*transportServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Deliver",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(deliverRequest)
			if err := dec(in); err != nil {
				return nil, status.Error(codes.InvalidArgument, err.Error())
			}
			resp, written := srv.(*transport).serveDeliver(ctx, in)
			written() // (the unary path's answer is written after this returns)
			return resp, nil
		},
	}, {
		MethodName: "Hot",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(hotRequest)
			if err := dec(in); err != nil {
				return nil, status.Error(codes.InvalidArgument, err.Error())
			}
			return srv.(*transport).serveHot(in), nil
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Stream",
		ServerStreams: true,
		ClientStreams: true,
		Handler:       func(srv any, ss grpc.ServerStream) error { return srv.(*transport).serveStream(ss) },
	}},
	Metadata: "runner/transport.proto",
}

const hotMethod = "/shardhost.v1.Runner/Hot"

// serveHot lists the shard's resident entities, most recently used first.
func (t *transport) serveHot(req *hotRequest) *hotResponse {
	keys := t.r.residents.hot(sharding.ShardID(req.Shard), int(min(req.Limit, 4096)))
	resp := &hotResponse{Entities: make([]entityRef, len(keys))}
	for i, k := range keys {
		resp.Entities[i] = entityRef{Kind: k.kind, ID: k.id}
	}
	return resp
}

// hot asks the runner at addr for its hot entities in shard.
func (t *transport) hot(ctx context.Context, addr string, shard sharding.ShardID, limit int) ([]entityRef, error) {
	c, err := t.ready(ctx, addr)
	if err != nil {
		return nil, err
	}
	resp := new(hotResponse)
	if err := c.Invoke(ctx, hotMethod, &hotRequest{Shard: uint32(shard), Limit: uint32(limit)}, resp); err != nil {
		return nil, fmt.Errorf("runner: hot entities of shard %d from %s: %w", shard, addr, err)
	}
	return resp.Entities, nil
}

// transport is a runner's gRPC server and its connections to peers.
type transport struct {
	r   *Runner
	srv *grpc.Server
	lis net.Listener

	limit                         *limitListener // lis, counting connections
	handshakeTimeout, idleTimeout time.Duration  // serverHandshakeTimeout, serverMaxConnectionIdle (tests shorten them)
	refused, refusedLog           atomic.Int64   // connections refused; when last logged (since clockBase)

	goaway     chan struct{} // closed when the server starts a graceful stop
	goawayOnce sync.Once

	mu     sync.Mutex
	peers  map[string]*peerConns
	stale  map[string]*time.Timer // peers that left: closed later, not under in-flight calls
	closed bool

	onServe atomic.Pointer[func(*deliverRequest, *deliverResponse)] // test hook
}

func newTransport(r *Runner) *transport {
	return &transport{
		r: r, peers: make(map[string]*peerConns), stale: make(map[string]*time.Timer), goaway: make(chan struct{}),
		handshakeTimeout: serverHandshakeTimeout, idleTimeout: serverMaxConnectionIdle,
	}
}

// connsPerPeer is how many HTTP/2 connections a runner keeps to each peer:
// calls are spread over them, so one connection's reader and writer
// goroutines do not serialize all traffic to a peer.
const connsPerPeer = 2

// peerConns are the connections to one peer, each with its delivery
// stream.
type peerConns struct {
	conns []*grpc.ClientConn
	next  atomic.Uint32

	mu      sync.Mutex
	streams []*muxStream // by connection; replaced when unusable
}

// pick chooses a connection, round robin.
func (p *peerConns) pick() (int, *grpc.ClientConn) {
	i := int(p.next.Add(1)) % len(p.conns)
	return i, p.conns[i]
}

// stream returns connection i's delivery stream, opening a new one when
// there is none or it is closing.
func (p *peerConns) stream(i int) (*muxStream, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ms := p.streams[i]; ms != nil && ms.usable() {
		return ms, nil
	}
	ms, err := newMuxStream(p.conns[i])
	if err != nil {
		return nil, err
	}
	p.streams[i] = ms
	return ms, nil
}

func (p *peerConns) close() {
	p.mu.Lock()
	for _, ms := range p.streams {
		if ms != nil {
			ms.cancel()
		}
	}
	p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

// listen opens the server's listener (before registration, so the
// advertised address is known).
func (t *transport) listen() error {
	lis, err := net.Listen("tcp", t.r.cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("runner: listen on %s: %w", t.r.cfg.ListenAddr, err)
	}
	t.limit = newLimitListener(lis, t.r.cfg.MaxConnections, t.rejected)
	t.lis = t.limit
	creds := insecure.NewCredentials()
	if t.r.cfg.TLS != nil {
		creds = credentials.NewTLS(t.r.cfg.TLS)
	}
	t.srv = grpc.NewServer(
		grpc.Creds(creds),
		grpc.ConnectionTimeout(t.handshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: t.idleTimeout, Time: serverPingTime, Timeout: serverPingTimeout,
		}),
		grpc.NumStreamWorkers(uint32(max(2, runtime.GOMAXPROCS(0)))),
		grpc.ForceServerCodec(wireCodec{}),
		// The transport limit is generous so that an oversized request
		// never breaks a shared stream; serveDeliver enforces
		// MaxMessageSize itself and answers TOO_LARGE.
		grpc.MaxRecvMsgSize(max(t.r.cfg.MaxMessageSize, 64<<20)+1024),
		grpc.MaxSendMsgSize(t.r.cfg.MaxMessageSize+1024),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: serverMinPingInterval, PermitWithoutStream: true}),
	)
	t.srv.RegisterService(&serviceDesc, transportServer(t))
	return nil
}

// rejected logs connections refused by MaxConnections, at most once a
// minute.
func (t *transport) rejected(open int64) {
	n := t.refused.Add(1)
	now := time.Since(clockBase)
	last := t.refusedLog.Load()
	if last != 0 && now-time.Duration(last) < time.Minute || !t.refusedLog.CompareAndSwap(last, int64(now)) {
		return
	}
	t.r.log.Warn("transport connection refused: MaxConnections reached", "open", open, "limit", t.r.cfg.MaxConnections, "refused_total", n)
}

func (t *transport) serve() {
	if err := t.srv.Serve(t.lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		t.r.log.Error("transport server failed", "err", err)
	}
}

// stop ends serving: graceful within d, then abrupt; and closes peers.
func (t *transport) stop(d time.Duration) {
	t.goawayOnce.Do(func() { close(t.goaway) }) // streams: stop sending here
	if t.srv != nil && d > 0 {
		done := make(chan struct{})
		go func() { t.srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(d):
			t.srv.Stop()
			<-done
		}
	} else if t.srv != nil {
		t.srv.Stop()
	}
	t.mu.Lock()
	t.closed = true
	peers := t.peers
	t.peers = map[string]*peerConns{}
	for addr, tm := range t.stale {
		tm.Stop()
		delete(t.stale, addr)
	}
	t.mu.Unlock()
	for _, p := range peers {
		p.close()
	}
}

// forget closes connections to addresses no longer in the membership, once
// the calls in flight on them had time to finish (RequestTimeout): a peer
// that just deregistered still answers them during its graceful stop.
func (t *transport) forget(live map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for addr := range t.peers {
		if live[addr] {
			if tm, ok := t.stale[addr]; ok { // it came back
				tm.Stop()
				delete(t.stale, addr)
			}
			continue
		}
		if _, ok := t.stale[addr]; ok || t.closed {
			continue
		}
		t.stale[addr] = time.AfterFunc(t.r.cfg.RequestTimeout, func() {
			t.mu.Lock()
			c, ok := t.peers[addr]
			if ok && t.stale[addr] != nil {
				delete(t.peers, addr)
				delete(t.stale, addr)
			} else {
				ok = false
			}
			t.mu.Unlock()
			if ok {
				c.close()
			}
		})
	}
}

func (t *transport) peer(addr string) (*peerConns, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	if p, ok := t.peers[addr]; ok {
		return p, nil
	}
	creds := insecure.NewCredentials()
	if t.r.cfg.PeerTLS != nil {
		creds = credentials.NewTLS(t.r.cfg.PeerTLS)
	}
	p := &peerConns{}
	for range connsPerPeer {
		c, err := grpc.NewClient(addr,
			grpc.WithTransportCredentials(creds),
			grpc.WithDefaultCallOptions(
				grpc.ForceCodec(wireCodec{}),
				// Responses are bounded by the sender's own limit; a smaller
				// limit here would break the shared stream.
				grpc.MaxCallRecvMsgSize(max(t.r.cfg.MaxMessageSize, 64<<20)+1024),
				grpc.MaxCallSendMsgSize(t.r.cfg.MaxMessageSize+1024),
			),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 2 * time.Second, PermitWithoutStream: true}),
		)
		if err != nil {
			p.close()
			return nil, fmt.Errorf("runner: connect to %s: %w", addr, err)
		}
		p.conns = append(p.conns, c)
	}
	p.streams = make([]*muxStream, len(p.conns))
	t.peers[addr] = p
	return p, nil
}

// ready picks a connection to addr and waits, bounded, until it is ready.
// An error means nothing was sent.
func (t *transport) ready(ctx context.Context, addr string) (*grpc.ClientConn, error) {
	_, _, c, err := t.readyConn(ctx, addr)
	return c, err
}

func (t *transport) readyConn(ctx context.Context, addr string) (*peerConns, int, *grpc.ClientConn, error) {
	p, err := t.peer(addr)
	if err != nil {
		return nil, 0, nil, err
	}
	i, c := p.pick()
	if err := t.waitReady(ctx, addr, c); err != nil {
		return nil, 0, nil, err
	}
	return p, i, c, nil
}

// The errors say what happened in this call: how long it waited and why it
// stopped (its context, ConnectTimeout, or a connection that failed).
func (t *transport) waitReady(ctx context.Context, addr string, c *grpc.ClientConn) error {
	st := c.GetState()
	if st == connectivity.Ready {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w: connection to %s is %v and the context already ended: %w", ErrNotSent, addr, st, ctxErr(ctx))
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, t.r.cfg.ConnectTimeout)
	defer cancel()
	for st != connectivity.Ready {
		if st == connectivity.Idle {
			c.Connect()
		}
		if st == connectivity.TransientFailure || st == connectivity.Shutdown {
			return fmt.Errorf("%w: connection to %s is %v (its last attempt failed; waited %v)", ErrNotSent, addr, st, time.Since(start).Round(time.Millisecond))
		}
		if !c.WaitForStateChange(wctx, st) {
			waited := time.Since(start).Round(time.Millisecond)
			if ctx.Err() != nil {
				return fmt.Errorf("%w: connection to %s still %v when the context ended after %v: %w", ErrNotSent, addr, st, waited, ctxErr(ctx))
			}
			return fmt.Errorf("%w: connection to %s still %v after %v (ConnectTimeout)", ErrNotSent, addr, st, waited)
		}
		st = c.GetState()
	}
	return nil
}

// call delivers req to the runner at addr. sent is false when the message
// certainly did not reach a handler.
func (t *transport) call(ctx context.Context, owner, addr string, req *deliverRequest) (resp *deliverResponse, err error, sent bool) {
	if len(req.Payload) > t.r.cfg.MaxMessageSize {
		return nil, fmt.Errorf("%w: request of %d bytes (limit %d)", ErrMessageTooLarge, len(req.Payload), t.r.cfg.MaxMessageSize), false
	}
	p, i, c, err := t.readyConn(ctx, addr)
	if err != nil {
		return nil, err, false
	}
	if len(req.Payload) > maxStreamPayload {
		return t.unary(ctx, owner, addr, c, req)
	}
	ms, err := p.stream(i)
	if err != nil {
		return nil, fmt.Errorf("%w: open a delivery stream to %s: %v", ErrNotSent, addr, err), false
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.r.cfg.RequestTimeout)
		defer cancel()
	}
	resp, err, sent = ms.call(ctx, req)
	if err != nil && sent && errors.Is(err, ErrMaybeDelivered) {
		err = fmt.Errorf("to %s (%s): %w", owner, addr, err)
	}
	return resp, err, sent
}

// maxStreamPayload: larger requests travel as unary calls, so that one
// big message neither holds up the shared stream nor, if the receiver
// refuses its size, breaks it for every other call.
const maxStreamPayload = 64 << 10

// unary delivers req with its own RPC.
func (t *transport) unary(ctx context.Context, owner, addr string, c *grpc.ClientConn, req *deliverRequest) (*deliverResponse, error, bool) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.r.cfg.RequestTimeout)
		defer cancel()
	}
	resp := new(deliverResponse)
	if err := c.Invoke(ctx, deliverMethod, req, resp); err != nil {
		st, _ := status.FromError(err)
		switch st.Code() {
		case codes.ResourceExhausted:
			// The request or the response was over a limit; a response
			// means the handler ran, so never retry.
			return nil, fmt.Errorf("%w: %s", ErrMessageTooLarge, st.Message()), true
		case codes.DeadlineExceeded, codes.Canceled:
			if ctx.Err() != nil {
				return nil, fmt.Errorf("runner: ask to %s timed out (%w): %w", owner, ErrMaybeDelivered, context.Cause(ctx)), true
			}
		}
		return nil, fmt.Errorf("%w: to %s (%s): %v", ErrMaybeDelivered, owner, addr, err), true
	}
	return resp, nil, true
}

// serveDeliver answers a delivery (unary or on a stream) and shows the
// answer to the test hook. The caller calls written once the answer is
// written to the connection.
func (t *transport) serveDeliver(ctx context.Context, req *deliverRequest) (resp *deliverResponse, written func()) {
	resp, written = t.deliverHere(ctx, req)
	if hook := t.onServe.Load(); hook != nil {
		(*hook)(req, resp)
	}
	return resp, written
}

func nothing() {}

// deliverHere is the receiving side: local delivery only, never a second
// hop. Every outcome is an answer (a Code), never a transport error.
func (t *transport) deliverHere(ctx context.Context, req *deliverRequest) (*deliverResponse, func()) {
	resp, sh := t.deliverTo(ctx, req)
	if sh == nil {
		return resp, nothing
	}
	return resp, sh.replyWritten
}

// deliverTo delivers req here; sh is the shard host whose replying count
// the answer is in (nil when not counted).
func (t *transport) deliverTo(ctx context.Context, req *deliverRequest) (*deliverResponse, *shardHost) {
	r := t.r
	k := r.kind(req.Kind)
	if k == nil {
		return &deliverResponse{Code: codeUnknownKind, Message: fmt.Sprintf("kind %q not registered on %s", req.Kind, r.cfg.ID)}, nil
	}
	h, ok := k.desc.Handler(req.Method)
	if !ok {
		return &deliverResponse{Code: codeUnknownMethod, Message: fmt.Sprintf("%s.%s", req.Kind, req.Method)}, nil
	}
	codec := k.opts.Codec
	switch {
	case req.Codec != "" && req.Codec != codec.Name():
		return &deliverResponse{Code: codeBadRequest, Message: fmt.Sprintf("codec %q, kind %q uses %q", req.Codec, req.Kind, codec.Name())}, nil
	case h.OneWay() != req.OneWay:
		return &deliverResponse{Code: codeBadRequest, Message: fmt.Sprintf("%s.%s: one-way mismatch", req.Kind, req.Method)}, nil
	}
	if len(req.Payload) > r.cfg.MaxMessageSize {
		return &deliverResponse{Code: codeTooLarge, Message: fmt.Sprintf("request of %d bytes (limit %d on %s)", len(req.Payload), r.cfg.MaxMessageSize, r.cfg.ID)}, nil
	}
	id := sharding.ShardOf(req.Entity, r.cfg.NumShards)
	if uint32(id) != req.Shard {
		return &deliverResponse{Code: codeBadRequest, Message: fmt.Sprintf("entity %q is shard %d here, %d at the sender: do all runners agree on NumShards?", req.Entity, id, req.Shard)}, nil
	}
	v, err := h.DecodeRequest(codec, req.Payload)
	if err != nil {
		return &deliverResponse{Code: codeBadRequest, Message: err.Error()}, nil
	}
	sh := r.hosts[id].Load()
	if sh == nil {
		return errorResponse(r.notHere(id), false), nil
	}
	res := sh.deliver(ctx, k, h, req.Entity, v, req.OneWay, true)
	counted := sh
	if !res.admitted || req.OneWay {
		counted = nil // not admitted, or a signal: not counted
	}
	if res.err != nil {
		resp := errorResponse(res.err, !res.undelivered)
		resp.Epoch = uint64(res.epoch)
		return resp, counted
	}
	if req.OneWay {
		return &deliverResponse{}, counted
	}
	b, err := codec.Marshal(res.v)
	if err != nil {
		return &deliverResponse{Code: codeHandlerError, Message: fmt.Sprintf("encode response: %v", err), Epoch: uint64(res.epoch)}, counted
	}
	if len(b) > r.cfg.MaxMessageSize {
		return &deliverResponse{Code: codeTooLarge, Message: fmt.Sprintf("response of %d bytes (limit %d)", len(b), r.cfg.MaxMessageSize)}, counted
	}
	return &deliverResponse{Payload: b, Epoch: uint64(res.epoch)}, counted
}

// errorResponse maps a delivery error to the wire. sent says whether the
// message may have reached a handler.
func errorResponse(err error, sent bool) *deliverResponse {
	var (
		no    *NotOwnerError
		ud    *UndeliveredError
		pe    *entity.PanicError
		stale *StaleResultError
	)
	switch {
	case !sent && errors.As(err, &no):
		return &deliverResponse{Code: codeNotOwner, Message: err.Error(), OwnerHint: no.OwnerHint, Shard: uint32(no.Shard)}
	case !sent && errors.As(err, &ud):
		return &deliverResponse{Code: codeUndelivered, Message: err.Error(), Shard: uint32(ud.Shard), Cause: causeOf(ud.Cause)}
	case !sent && errors.Is(err, entity.ErrMailboxFull):
		return &deliverResponse{Code: codeMailboxFull, Message: err.Error()}
	case !sent:
		return &deliverResponse{Code: codeUndelivered, Message: err.Error()}
	case errors.As(err, &stale):
		return &deliverResponse{Code: codeStaleResult, Message: stale.Reason, Shard: uint32(stale.Shard), Cause: causeOf(stale.Cause)}
	case errors.As(err, &pe):
		return &deliverResponse{Code: codeHandlerPanic, Message: pe.Value}
	default:
		return &deliverResponse{Code: codeHandlerError, Message: truncate(err.Error(), maxErrorMessage)}
	}
}

// maxErrorMessage bounds an error text sent back, so that an error never
// makes a response too large.
const maxErrorMessage = 4 << 10

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…(truncated)"
}

func causeOf(err error) wireCause {
	switch {
	case errors.Is(err, ErrDetached):
		return causeDetached
	case errors.Is(err, ErrShardMoved):
		return causeShardMoved
	case errors.Is(err, ErrShutdown):
		return causeShutdown
	}
	return causeUnspecified
}

func (c wireCause) err() error {
	switch c {
	case causeDetached:
		return ErrDetached
	case causeShardMoved:
		return ErrShardMoved
	case causeShutdown:
		return ErrShutdown
	}
	return errors.New("runner: not delivered")
}

// responseError maps a response from owner back to a typed error; retry
// reports whether the message certainly was not delivered.
func responseError(owner string, req *deliverRequest, resp *deliverResponse) (err error, retry bool) {
	switch resp.Code {
	case codeOK:
		return nil, false
	case codeNotOwner:
		return &NotOwnerError{Shard: sharding.ShardID(resp.Shard), OwnerHint: resp.OwnerHint}, true
	case codeUndelivered:
		return &UndeliveredError{Shard: sharding.ShardID(resp.Shard), Cause: resp.Cause.err()}, true
	case codeMailboxFull:
		return fmt.Errorf("%w (on %s): %s", entity.ErrMailboxFull, owner, resp.Message), false
	case codeUnknownKind:
		return fmt.Errorf("%w (on %s): %s", entity.ErrUnknownKind, owner, resp.Message), false
	case codeUnknownMethod:
		return fmt.Errorf("%w (on %s): %s", entity.ErrUnknownMethod, owner, resp.Message), false
	case codeTooLarge:
		return fmt.Errorf("%w (on %s): %s", ErrMessageTooLarge, owner, resp.Message), false
	case codeBadRequest:
		return fmt.Errorf("%w (on %s): %s", entity.ErrBadRequest, owner, resp.Message), false
	case codeHandlerPanic:
		return &entity.PanicError{Kind: req.Kind, Method: req.Method, Entity: req.Entity, Value: resp.Message}, false
	case codeStaleResult:
		return &StaleResultError{Shard: sharding.ShardID(req.Shard), Runner: owner, Epoch: storage.Epoch(resp.Epoch), Reason: resp.Message, Cause: resp.Cause.err()}, false
	default:
		return &RemoteError{Runner: owner, Message: resp.Message}, false
	}
}
