package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// clockBase makes monotonic nanosecond readings: time.Since(clockBase).
var clockBase = time.Now()

// ctxErr is ctx's error with its cause.
func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

const deliverMethod = "/shardhost.v1.Runner/Deliver"

// grpcService is the gRPC service of a runner (the handler type the
// service description checks).
type grpcService interface {
	serveHot(req *hotRequest) *hotResponse
	serveStream(ss grpc.ServerStream) error
	serveFrames(ss grpc.ServerStream) error
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: "shardhost.v1.Runner",
	HandlerType: (*grpcService)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Deliver",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(DeliverRequest)
			if err := dec(in); err != nil {
				return nil, status.Error(codes.InvalidArgument, err.Error())
			}
			resp, written := srv.(*GRPC).h.Deliver(ctx, in)
			written() // (the unary answer is written after this returns)
			return resp, nil
		},
	}, {
		MethodName: "Hot",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(hotRequest)
			if err := dec(in); err != nil {
				return nil, status.Error(codes.InvalidArgument, err.Error())
			}
			return srv.(*GRPC).serveHot(in), nil
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Stream",
		ServerStreams: true,
		ClientStreams: true,
		Handler:       func(srv any, ss grpc.ServerStream) error { return srv.(*GRPC).serveStream(ss) },
	}, {
		StreamName:    "Frames",
		ServerStreams: true,
		ClientStreams: true,
		Handler:       func(srv any, ss grpc.ServerStream) error { return srv.(*GRPC).serveFrames(ss) },
	}},
	Metadata: "transport/transport.proto",
}

const hotMethod = "/shardhost.v1.Runner/Hot"

// serveHot lists the shard's resident entities, most recently used first.
func (t *GRPC) serveHot(req *hotRequest) *hotResponse {
	es := t.h.Hot(req.Shard, int(min(req.Limit, maxHotEntities)))
	return &hotResponse{Entities: es[:min(len(es), maxHotEntities)]}
}

// hot asks the runner at addr for its hot entities in shard.
func (t *GRPC) Hot(ctx context.Context, addr string, shard uint32, limit int) ([]EntityRef, error) {
	_, _, c, err := t.readyConn(ctx, addr, nil)
	if err != nil {
		return nil, err
	}
	resp := new(hotResponse)
	if err := c.Invoke(ctx, hotMethod, &hotRequest{Shard: shard, Limit: uint32(limit)}, resp); err != nil {
		return nil, fmt.Errorf("transport: hot entities of shard %d from %s: %w", shard, addr, err)
	}
	return resp.Entities, nil
}

// GRPC is the production Transport: a gRPC server on a TCP listener
// (optional TLS) answering unary Deliver and Hot calls and the multiplexed
// Stream, and connections to peers (connsPerPeer per peer, each with one
// delivery stream). See transport.proto.
type GRPC struct {
	cfg GRPCConfig
	log *slog.Logger
	h   Handler

	srv *grpc.Server
	lis net.Listener

	limit                         *limitListener // lis, counting connections
	handshakeTimeout, idleTimeout time.Duration  // serverHandshakeTimeout, serverMaxConnectionIdle (tests shorten them)
	refused, refusedLog           atomic.Int64   // connections refused; when last logged (since clockBase)
	inRefused, outRefused         handshakeLog   // TLS handshakes refused, both ways (peertls.go)
	budgets                       connBudgets    // of the connections' delivery streams (bounds.go)
	writers                       writerSet      // of the delivery streams, for the watchdog (framewriter.go)
	stallAfter                    time.Duration  // stallAfter (tests shorten it)
	watchStop                     chan struct{}  // closed to stop the watchdog

	goaway     chan struct{} // closed when the server starts a graceful stop
	goawayOnce sync.Once
	serving    sync.WaitGroup // the Serve goroutine and the watchdog
	closeOnce  sync.Once

	mu     sync.RWMutex // (read-locked by every call to find its peer)
	peers  map[string]*peerConns
	stale  map[string]*time.Timer // peers that left: closed later, not under in-flight calls
	closed bool
}

var _ Transport = (*GRPC)(nil)

// GRPCConfig configures a GRPC transport. Zero fields mean the defaults
// given.
type GRPCConfig struct {
	// ListenAddr is where to serve, e.g. ":7100" or "127.0.0.1:0"; "" for
	// no server (a client-only runner).
	ListenAddr string
	// TLS configures the server (nil: plaintext); PeerTLS the connections
	// to peers. Handshakes they refuse are logged at WARN with the peer's
	// address and the reason (at most once a minute each way, with a
	// count).
	TLS, PeerTLS *tls.Config
	// VerifyPeer, if set, is called after every TLS handshake once the
	// configuration's own checks passed (tls.Config.VerifyConnection): on
	// the server with addr "" and the client's verified certificate, on a
	// connection to a peer with the address dialed and the peer's. An
	// error refuses the connection (logged as above). It may be called
	// from several goroutines at once.
	VerifyPeer func(addr string, cs tls.ConnectionState) error
	// MaxMessageSize bounds a request or response payload. Default 4 MiB.
	// A message (a payload with its strings and headers) over
	// MaxMessageSize + 64 KiB is refused on every RPC, both ways: give
	// every runner of a cluster the same (see "Bounds" in the package
	// doc).
	MaxMessageSize int
	// RequestTimeout bounds a call whose context has no deadline. Default
	// 30 s.
	RequestTimeout time.Duration
	// ConnectTimeout bounds waiting for a connection before sending.
	// Default 1 s.
	ConnectTimeout time.Duration
	// MaxConnections bounds the connections the server holds at once.
	// Default 1024.
	MaxConnections int
	// Logger for the server's troubles. Default slog.Default().
	Logger *slog.Logger
}

// NewGRPC returns a gRPC transport; it serves only once Listen is called.
func NewGRPC(cfg GRPCConfig) *GRPC {
	if cfg.MaxMessageSize <= 0 {
		cfg.MaxMessageSize = 4 << 20
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = time.Second
	}
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = 1024
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &GRPC{
		cfg: cfg, log: cfg.Logger, peers: make(map[string]*peerConns), stale: make(map[string]*time.Timer), goaway: make(chan struct{}),
		handshakeTimeout: serverHandshakeTimeout, idleTimeout: serverMaxConnectionIdle,
		budgets: connBudgets{maxBytes: connBytes(cfg.MaxMessageSize)}, stallAfter: stallAfter, watchStop: make(chan struct{}),
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

	streams []atomic.Pointer[muxStream] // by connection; replaced (under mu) when unusable

	maxMessageSize int           // GRPCConfig.MaxMessageSize
	connectTimeout time.Duration // GRPCConfig.ConnectTimeout: the most a new delivery stream waits for a slot

	mu     sync.Mutex
	legacy bool // the peer does not know rpc Frames: use rpc Stream
}

// pick chooses a connection, round robin.
func (p *peerConns) pick() (int, *grpc.ClientConn) {
	i := int(p.next.Add(1)) % len(p.conns)
	return i, p.conns[i]
}

// stream returns connection i's delivery stream, opening a new one when
// there is none or it is closing.
func (p *peerConns) stream(i int) (*muxStream, error) {
	if ms := p.streams[i].Load(); ms != nil && ms.usable() { // no lock: every call passes here
		return ms, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ms := p.streams[i].Load()
	if ms != nil && ms.usable() {
		return ms, nil
	}
	for j := range p.streams {
		if s := p.streams[j].Load(); s != nil && s.refused() {
			p.legacy = true
		}
	}
	ms, err := newMuxStream(p.conns[i], p.legacy, p.maxMessageSize, p.connectTimeout)
	if err != nil {
		return nil, err
	}
	p.streams[i].Store(ms)
	return ms, nil
}

func (p *peerConns) close() {
	p.mu.Lock()
	for i := range p.streams {
		if ms := p.streams[i].Load(); ms != nil {
			ms.cancel()
		}
	}
	p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

// Listen implements Transport: it opens the listener (so the address is
// known before the runner registers) and serves on it until Close.
func (t *GRPC) Listen(h Handler) (string, error) {
	t.h = h
	if t.cfg.ListenAddr == "" {
		return "", nil
	}
	lis, err := net.Listen("tcp", t.cfg.ListenAddr)
	if err != nil {
		return "", fmt.Errorf("transport: listen on %s: %w", t.cfg.ListenAddr, err)
	}
	t.limit = newLimitListener(lis, t.cfg.MaxConnections, t.rejected)
	t.lis = t.limit
	creds := insecure.NewCredentials()
	if t.cfg.TLS != nil {
		creds = loggingCreds{TransportCredentials: credentials.NewTLS(t.serverTLS()), t: t}
	}
	t.srv = grpc.NewServer(
		grpc.Creds(creds),
		grpc.ConnectionTimeout(t.handshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: t.idleTimeout, Time: serverPingTime, Timeout: serverPingTimeout,
		}),
		grpc.NumStreamWorkers(uint32(max(2, runtime.GOMAXPROCS(0)))),
		grpc.ForceServerCodecV2(wireCodec{}),
		// Every RPC: a payload of MaxMessageSize with its envelope. The
		// handler answers a request whose payload alone is over
		// MaxMessageSize TOO_LARGE; a message over the limit fails its
		// RPC (a stream: every call on it).
		grpc.MaxRecvMsgSize(messageLimit(t.cfg.MaxMessageSize)),
		grpc.MaxSendMsgSize(messageLimit(t.cfg.MaxMessageSize)),
		grpc.MaxConcurrentStreams(maxStreamsPerConn),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: serverMinPingInterval, PermitWithoutStream: true}),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
	)
	t.srv.RegisterService(&serviceDesc, grpcService(t))
	t.serving.Go(t.serve)
	t.serving.Go(func() { t.writers.watch(t.stallAfter, t.watchStop) })
	return lis.Addr().String(), nil
}

// rejected logs connections refused by MaxConnections, at most once a
// minute.
func (t *GRPC) rejected(open int64) {
	n := t.refused.Add(1)
	now := time.Since(clockBase)
	last := t.refusedLog.Load()
	if last != 0 && now-time.Duration(last) < time.Minute || !t.refusedLog.CompareAndSwap(last, int64(now)) {
		return
	}
	t.log.Warn("transport connection refused: MaxConnections reached", "open", open, "limit", t.cfg.MaxConnections, "refused_total", n)
}

func (t *GRPC) serve() {
	if err := t.srv.Serve(t.lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		t.log.Error("transport server failed", "err", err)
	}
}

// Close implements Transport.
func (t *GRPC) Close(d time.Duration) {
	t.closeOnce.Do(func() { t.close(d) })
}

func (t *GRPC) close(d time.Duration) {
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
	close(t.watchStop)
	t.serving.Wait()
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

// Forget implements Transport: connections to addresses not in live are
// closed once the calls in flight on them had time to finish
// (RequestTimeout): a peer that just deregistered still answers them
// during its graceful stop.
func (t *GRPC) Forget(live map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for addr := range t.peers {
		if live[addr] {
			if tm, ok := t.stale[addr]; ok { // it came back (a restart)
				tm.Stop()
				delete(t.stale, addr)
				// Its connections may be waiting out a long reconnect
				// back-off from while it was down: try now.
				for _, c := range t.peers[addr].conns {
					c.ResetConnectBackoff()
				}
			}
			continue
		}
		if _, ok := t.stale[addr]; ok || t.closed {
			continue
		}
		t.stale[addr] = time.AfterFunc(t.cfg.RequestTimeout, func() {
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

func (t *GRPC) peer(addr string) (*peerConns, error) {
	t.mu.RLock()
	p, ok := t.peers[addr]
	closed := t.closed
	t.mu.RUnlock()
	if ok && !closed {
		return p, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	if p, ok := t.peers[addr]; ok {
		return p, nil
	}
	creds := insecure.NewCredentials()
	if t.cfg.PeerTLS != nil {
		creds = loggingCreds{TransportCredentials: credentials.NewTLS(t.peerTLS(addr)), t: t, peer: addr}
	}
	p = &peerConns{maxMessageSize: t.cfg.MaxMessageSize, connectTimeout: t.cfg.ConnectTimeout}
	for range connsPerPeer {
		c, err := grpc.NewClient(addr,
			grpc.WithTransportCredentials(creds),
			grpc.WithDefaultCallOptions(
				grpc.ForceCodecV2(wireCodec{}),
				// An answer is bounded by the peer's MaxMessageSize: runners
				// of a cluster share one (doc.go, "Bounds").
				grpc.MaxCallRecvMsgSize(messageLimit(t.cfg.MaxMessageSize)),
				grpc.MaxCallSendMsgSize(messageLimit(t.cfg.MaxMessageSize)),
			),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 2 * time.Second, PermitWithoutStream: true}),
			grpc.WithConnectParams(reconnectParams),
			grpc.WithInitialWindowSize(streamWindow),
			grpc.WithInitialConnWindowSize(connWindow),
		)
		if err != nil {
			p.close()
			return nil, fmt.Errorf("transport: connect to %s: %w", addr, err)
		}
		p.conns = append(p.conns, c)
	}
	p.streams = make([]atomic.Pointer[muxStream], len(p.conns))
	t.peers[addr] = p
	return p, nil
}

// The HTTP/2 flow-control windows of a connection and of each stream on
// it, both ways. Set, they turn off gRPC's bandwidth-delay probing, which
// otherwise pings and resizes the windows as data arrives: on a delivery
// stream carrying a small message at a time that is extra frames and
// system calls per message. Windows this large are sent back rarely.
const (
	streamWindow = 4 << 20
	connWindow   = 16 << 20
)

// reconnectParams bound how long a connection to a peer that went away
// waits between attempts: gRPC's default back-off grows to 120 s, so a
// runner restarted on the same address after a minute down would stay
// unreachable for up to two more minutes. Here attempts are at most 2 s
// apart (peers are runners of one cluster, few and close).
var reconnectParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
	MinConnectTimeout: 2 * time.Second,
}

// readyConn picks a connection to addr and waits, bounded, until it is
// ready (and while route is current: RouteCaller). An error means nothing
// was sent.
func (t *GRPC) readyConn(ctx context.Context, addr string, route Route) (*peerConns, int, *grpc.ClientConn, error) {
	p, err := t.peer(addr)
	if err != nil {
		return nil, 0, nil, err
	}
	i, c := p.pick()
	if err := t.waitReady(ctx, addr, c, route); err != nil {
		return nil, 0, nil, err
	}
	return p, i, c, nil
}

// The errors say what happened in this call: how long it waited and why it
// stopped (its context, ConnectTimeout, its route that changed, or a
// connection that failed).
func (t *GRPC) waitReady(ctx context.Context, addr string, c *grpc.ClientConn, route Route) error {
	st := c.GetState()
	if st == connectivity.Ready {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w: connection to %s is %v and the context already ended: %w", ErrNotSent, addr, st, ctxErr(ctx))
	}
	start := time.Now()
	rctx, stop := whileCurrent(ctx, route)
	defer stop()
	wctx, cancel := context.WithTimeout(rctx, t.cfg.ConnectTimeout)
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
			if rctx.Err() != nil {
				return fmt.Errorf("%w: %w: connection to %s still %v after %v", ErrNotSent, ErrRouteChanged, addr, st, waited)
			}
			return fmt.Errorf("%w: connection to %s still %v after %v (ConnectTimeout)", ErrNotSent, addr, st, waited)
		}
		st = c.GetState()
	}
	return nil
}

var _ RouteCaller = (*GRPC)(nil)

// Call implements Transport.
func (t *GRPC) Call(ctx context.Context, addr string, req *DeliverRequest) (resp *DeliverResponse, sent bool, err error) {
	return t.CallRoute(ctx, addr, req, nil)
}

// CallRoute implements RouteCaller.
func (t *GRPC) CallRoute(ctx context.Context, addr string, req *DeliverRequest, route Route) (resp *DeliverResponse, sent bool, err error) {
	if len(req.Payload) > t.cfg.MaxMessageSize {
		return nil, false, fmt.Errorf("%w: request of %d bytes (limit %d)", ErrMessageTooLarge, len(req.Payload), t.cfg.MaxMessageSize)
	}
	if n := req.size(); n > messageLimit(t.cfg.MaxMessageSize) {
		return nil, false, fmt.Errorf("%w: request of %d bytes with its strings and headers (limit %d + %d)", ErrMessageTooLarge, n, t.cfg.MaxMessageSize, messageEnvelope)
	}
	p, i, c, err := t.readyConn(ctx, addr, route)
	if err != nil {
		return nil, false, err
	}
	if len(req.Payload) > maxStreamPayload {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, t.cfg.RequestTimeout)
			defer cancel()
		}
		return t.unary(ctx, addr, c, req)
	}
	ms, err := p.stream(i)
	if err != nil {
		return nil, false, fmt.Errorf("%w: open a delivery stream to %s: %v", ErrNotSent, addr, err)
	}
	resp, err, sent = ms.call(ctx, req, t.cfg.RequestTimeout)
	if err != nil && sent && errors.Is(err, ErrMaybeDelivered) {
		err = fmt.Errorf("to %s: %w", addr, err)
	}
	return resp, sent, err
}

// maxStreamPayload: larger requests travel as unary calls, so that one
// big message neither holds up the shared stream nor, if the receiver
// refuses its size, breaks it for every other call.
const maxStreamPayload = 64 << 10

// unary delivers req with its own RPC.
func (t *GRPC) unary(ctx context.Context, addr string, c *grpc.ClientConn, req *DeliverRequest) (*DeliverResponse, bool, error) {
	resp := new(DeliverResponse)
	if err := c.Invoke(ctx, deliverMethod, req, resp); err != nil {
		st, _ := status.FromError(err)
		switch st.Code() {
		case codes.ResourceExhausted:
			// The request or the response was over a limit; a response
			// means the handler ran, so never retry.
			return nil, true, fmt.Errorf("%w: %s", ErrMessageTooLarge, st.Message())
		case codes.DeadlineExceeded, codes.Canceled:
			if ctx.Err() != nil {
				return nil, true, fmt.Errorf("transport: call to %s timed out (%w): %w", addr, ErrMaybeDelivered, context.Cause(ctx))
			}
		}
		return nil, true, fmt.Errorf("%w: to %s: %v", ErrMaybeDelivered, addr, err)
	}
	return resp, true, nil
}
