package runner

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/transport"
)

// ParkedForTest returns how many requests wait parked here (park.go).
func (r *Runner) ParkedForTest() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.parked.total
}

// ServeObserver is the default gRPC transport of a runner with a function
// that sees every request it answers, with its answer: set it as the
// runner's Config.Transport, then Observe.
type ServeObserver struct {
	*transport.GRPC
	f atomic.Pointer[func(*transport.DeliverRequest, *transport.DeliverResponse)]
}

// NewServeObserver returns the transport New would make for cfg (without
// RequireClusterPeers' check), observing nothing yet.
func NewServeObserver(cfg Config) *ServeObserver {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	return &ServeObserver{GRPC: newTransport(cfg, cfg.Logger, nil).(*transport.GRPC)}
}

// Observe makes f see every request answered from now on (nil: none).
func (o *ServeObserver) Observe(f func(*transport.DeliverRequest, *transport.DeliverResponse)) {
	if f == nil {
		o.f.Store(nil)
		return
	}
	o.f.Store(&f)
}

// Listen serves h, showing each answer to the observing function.
func (o *ServeObserver) Listen(h transport.Handler) (string, error) {
	return o.GRPC.Listen(observedHandler{h, o})
}

type observedHandler struct {
	transport.Handler
	o *ServeObserver
}

func (h observedHandler) Deliver(ctx context.Context, req *transport.DeliverRequest) (*transport.DeliverResponse, func()) {
	resp, written := h.Handler.Deliver(ctx, req)
	if f := h.o.f.Load(); f != nil {
		(*f)(req, resp)
	}
	return resp, written
}

// ShardContext returns the context of shard id while r owns it, for the
// tests that check it ends with the shard (context.Cause: ErrDetached,
// ErrShardMoved, ErrShutdown).
func (r *Runner) ShardContext(id sharding.ShardID) (context.Context, storage.Epoch, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.shards.owner(id)
	if s == nil {
		return nil, 0, false
	}
	return s.ctx, s.epoch, true
}
