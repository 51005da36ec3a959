package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/hosting"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/transport"
)

// Send delivers a call to its entity, wherever its shard is owned. It
// implements entity.Sender: use the typed Ask and Tell of method references
// rather than calling it.
//
// Admission comes first: a ctx that has already ended fails the call at
// once with an error matching ctx's (context.Canceled or
// context.DeadlineExceeded), and nothing is delivered; a runner that is not
// running (Run not called yet, or returned) fails it at once with ErrClosed.
// A queued ask whose ctx ends before its handler starts is not run either.
//
// Routing follows the actual lock owner in this runner's watch of the shard
// locks: local delivery when this runner owns the shard at its current
// epoch, otherwise one hop to the owner (which never forwards). Send
// retries, with jittered exponential backoff and a wake-up on every routing
// change, exactly the failures that guarantee the message reached no
// handler: not the owner (*NotOwnerError), not delivered
// (*UndeliveredError: detached, shard moved, shutting down), owner not
// reachable before sending (ErrNotSent), and no owner yet. It gives up when
// ctx ends, returning ctx's cause joined with the last such error.
// Delivery is at most once per call: any other error (a handler error, a
// timeout or a connection lost after sending: ErrMaybeDelivered) is
// returned as is, and the handler may have run — except for methods
// defined with entity.Idempotent, which are sent again after
// ErrMaybeDelivered (a *StaleResultError included) until they succeed,
// fail otherwise, or ctx ends (see sendIdempotent).
func (r *Runner) Send(ctx context.Context, c entity.Call) (any, error) {
	v, err := r.sendOnce(ctx, c)
	if err != nil && c.Handler != nil && c.Handler.Idempotent() && errors.Is(err, ErrMaybeDelivered) {
		return r.sendIdempotent(ctx, c, err)
	}
	return v, err
}

// sendOnce is one Send: admission, routing and the retries that keep
// delivery at most once.
func (r *Runner) sendOnce(ctx context.Context, c entity.Call) (any, error) {
	if err := r.admit(ctx, c); err != nil {
		return nil, err
	}
	k, h, err := r.resolve(c)
	if err != nil {
		return nil, err
	}
	id := sharding.ShardOf(c.Entity, r.cfg.NumShards)
	var first error
	if sh := r.hosting.Lookup(id); sh != nil { // fast path
		res := sh.Deliver(ctx, k, h, c.Entity, c.Req, h.OneWay(), false)
		if !res.Undelivered || !retryable(res.Err) {
			return res.V, res.Err
		}
		first = res.Err
	}
	return r.sendSlow(ctx, k, h, id, c, first)
}

// resolve finds the registered kind and handler of a call.
func (r *Runner) resolve(c entity.Call) (*hosting.Kind, *entity.Handler, error) {
	if c.Kind == nil {
		return nil, nil, fmt.Errorf("%w: nil kind", entity.ErrUnknownKind)
	}
	k := r.hosting.Kind(c.Kind.Name())
	if k == nil {
		return nil, nil, fmt.Errorf("%w: %q is not registered on runner %s", entity.ErrUnknownKind, c.Kind.Name(), r.cfg.ID)
	}
	h := c.Handler
	if h == nil || k.Desc != c.Kind {
		name := ""
		if h != nil {
			name = h.Name()
		}
		var ok bool
		if h, ok = k.Desc.Handler(name); !ok {
			return nil, nil, fmt.Errorf("%w: %s.%s", entity.ErrUnknownMethod, k.Desc.Name(), name)
		}
	}
	return k, h, nil
}

// retryable reports whether a pre-delivery error from this runtime may be
// retried (backpressure such as a full mailbox is not).
func retryable(err error) bool {
	var (
		no *NotOwnerError
		ud *UndeliveredError
	)
	return errors.As(err, &no) || errors.As(err, &ud) || errors.Is(err, ErrNotSent) || errors.Is(err, ErrNoOwner)
}

func newBackoff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 5 * time.Millisecond
	b.RandomizationFactor = 0.5
	b.Multiplier = 2
	b.MaxInterval = 250 * time.Millisecond
	b.MaxElapsedTime = 0 // until the caller's context ends
	b.Reset()
	return b
}

// sendSlow is the routing loop with retries.
func (r *Runner) sendSlow(ctx context.Context, k *hosting.Kind, h *entity.Handler, id sharding.ShardID, c entity.Call, last error) (any, error) {
	var (
		waiting bool // counted in r.waiting (MaxWaitingSends)
		bo      *backoff.ExponentialBackOff
		payload []byte
		timer   *time.Timer
		hint    string // owner named by the last NotOwner answer
		start   = time.Now()
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for attempt := 0; ; attempt++ {
		changed := r.routeWatch()
		var (
			v    any
			err  error
			sent bool
		)
		if sh := r.hosting.Lookup(id); sh != nil {
			res := sh.Deliver(ctx, k, h, c.Entity, c.Req, h.OneWay(), false)
			v, err, sent = res.V, res.Err, !res.Undelivered
		} else {
			owner, ok := r.route(id)
			if hint != "" && hint != owner.ID {
				// The last receiver knew better than our watch: try its
				// hint (one hop again, never forwarded further).
				if m, known := r.member(hint); known && m.Address != "" {
					owner, ok = m, true
				}
			}
			hint = ""
			switch {
			case !ok:
				err = r.noRoute(id, time.Since(start))
			case owner.Address == "":
				// The owner serves no transport: final, not retried.
				err, sent = fmt.Errorf("%w: shard %d is owned by runner %q, which serves no transport (its Config has neither ListenAddr nor Address), "+
					"so no other runner can reach its entities", ErrNoTransport, id, owner.ID), true
			default:
				if payload == nil {
					if payload, err = k.Opts.Codec.Marshal(c.Req); err != nil {
						return nil, fmt.Errorf("%w: encode %s.%s request: %w", entity.ErrBadRequest, k.Desc.Name(), h.Name(), err)
					}
				}
				v, err, sent = r.remote(ctx, owner, k, h, id, c, payload)
			}
		}
		if err == nil || sent || !retryable(err) {
			if attempt > 0 {
				r.met.sendRetries.Add(context.Background(), int64(attempt), r.met.attrs)
			}
			return v, err
		}
		if last == nil || !errors.Is(err, ErrNoOwner) || errors.Is(last, ErrNoOwner) {
			last = err // keep the most informative reason for the caller
		}
		var no *NotOwnerError
		if errors.As(err, &no) && no.OwnerHint != "" && no.OwnerHint != r.cfg.ID {
			hint = no.OwnerHint
		}
		if !waiting { // only sends that wait for an owner count
			if r.waiting.Add(1) > int64(r.cfg.MaxWaitingSends) {
				r.waiting.Add(-1)
				return nil, fmt.Errorf("%w (%d): %w", ErrTooManyWaiting, r.cfg.MaxWaitingSends, last)
			}
			waiting = true
			defer r.waiting.Add(-1)
		}
		if bo == nil {
			bo = newBackoff()
		}
		d := bo.NextBackOff()
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("runner: %s %q not delivered: %w (last attempt: %w)", k.Desc.Name(), c.Entity, hosting.ContextError(ctx), last)
		case <-changed:
			if !r.running.Load() {
				return nil, fmt.Errorf("%w; %s %q not delivered (last attempt: %w)", r.closedErr(), k.Desc.Name(), c.Entity, last)
			}
		case <-timer.C:
		}
	}
}

// remote delivers to the owner over the transport.
func (r *Runner) remote(ctx context.Context, owner storage.Runner, k *hosting.Kind, h *entity.Handler, id sharding.ShardID, c entity.Call, payload []byte) (any, error, bool) {
	req := &transport.DeliverRequest{
		Kind: k.Desc.Name(), Method: h.Name(), Entity: c.Entity, Payload: payload,
		OneWay: h.OneWay(), Shard: uint32(id), Sender: r.cfg.ID, Codec: k.Opts.Codec.Name(),
	}
	resp, sent, err := r.net.Call(ctx, owner.Address, req)
	if err != nil {
		if sent {
			err = fmt.Errorf("to %s: %w", owner.ID, err)
		}
		return nil, err, sent
	}
	if resp.Epoch != 0 && resp.Code != transport.CodeStaleResult {
		// A result (value, handler error or panic): withheld if it may
		// come from a former owner that lost the shard while it ran.
		if err := r.checkEpoch(id, owner, storage.Epoch(resp.Epoch)); err != nil {
			return nil, err, true
		}
	}
	if err, retry := responseError(owner.ID, req, resp); err != nil {
		return nil, err, !retry
	}
	if h.OneWay() {
		return nil, nil, true
	}
	v, err := h.DecodeResponse(k.Opts.Codec, resp.Payload)
	if err != nil {
		return nil, fmt.Errorf("runner: response from %s: %w", owner.ID, err), true
	}
	return v, nil, true
}

// checkEpoch is the sender's half of the rule that no result of a former
// owner is acknowledged after a newer owner started: a result computed
// under epoch by owner is refused with a *StaleResultError when a newer
// epoch of shard id was already seen (lock watch, installs, replies) and
// owner's lease, under which it held the shard, has ended (expired or
// revoked: the shard may have been taken while the handler ran). A result
// from a live owner is accepted: a live owner moves a shard only after its
// drain, in which every handler finished and every reply was written, so
// its result ran before the newer epoch began. The owner's own check (the
// detach instant and its shard's hosting, at the handler's end) covers the
// rest; this one closes the gap between that check and the socket write.
func (r *Runner) checkEpoch(id sharding.ShardID, owner storage.Runner, epoch storage.Epoch) error {
	newer := storage.Epoch(r.epochs[id].Load())
	if newer <= epoch {
		r.sawEpoch(id, epoch)
		return nil
	}
	r.mu.Lock()
	_, live := r.byLease[owner.Lease]
	r.mu.Unlock()
	if live {
		return nil
	}
	r.met.host.Dropped.Add(context.Background(), 1, r.met.attrs, withReason(hosting.DropStaleResult))
	r.log.Warn("result from an ended lease, older than an epoch already seen; withheld",
		"shard", id, "from", owner.ID, "epoch", epoch, "seen", newer)
	return &StaleResultError{Shard: id, Runner: owner.ID, Epoch: epoch, Newer: newer, Cause: ErrShardMoved}
}

// sawEpoch records that shard id was owned at epoch (a lock in the watch,
// an ownership installed here, a reply).
func (r *Runner) sawEpoch(id sharding.ShardID, epoch storage.Epoch) {
	p := &r.epochs[id]
	for cur := p.Load(); int64(epoch) > cur; cur = p.Load() {
		if p.CompareAndSwap(cur, int64(epoch)) {
			return
		}
	}
}

// route returns the member owning shard id in this runner's view (its
// Address is "" if it serves no transport); ok is false when the shard is
// unowned, owned by a runner not in the membership, or owned by this runner
// but not hosted (in transition).
func (r *Runner) route(id sharding.ShardID) (owner storage.Runner, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if to, moved := r.movedTo[id]; moved { // we just handed it off
		if m, ok := r.members[to]; ok {
			return m, true
		}
	}
	l, held := r.locks.get(id)
	if !held {
		return owner, false
	}
	m, known := r.byLease[l.Lease]
	if !known || (m.ID == r.cfg.ID && m.Incarnation == r.incarnation) {
		return owner, false
	}
	return m, true
}

// member returns the record of member id.
func (r *Runner) member(id string) (storage.Runner, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.members[id]
	return m, ok
}

// noRoute explains a shard with no route after waited: detached, ours in
// transition, or no owner known — and then why (noOwnerReason).
func (r *Runner) noRoute(id sharding.ShardID, waited time.Duration) error {
	r.mu.Lock()
	detached := r.phase == phaseDetached
	_, ours := r.owned[id]
	l, held := r.locks.get(id)
	mine := held && l.Lease == r.lease && r.lease != 0
	r.mu.Unlock()
	switch {
	case detached:
		return &UndeliveredError{Shard: id, Cause: ErrDetached}
	case ours || mine:
		return &UndeliveredError{Shard: id, Cause: ErrShardMoved}
	default:
		return fmt.Errorf("%w: shard %d: %s", ErrNoOwner, id, r.noOwnerReason(id, waited))
	}
}

// routeWatch returns a channel closed at the next routing change.
func (r *Runner) routeWatch() <-chan struct{} { return *r.routeCh.Load() }

// routesChanged wakes every send waiting for a routing change. Each
// channel is swapped out, hence closed, exactly once.
func (r *Runner) routesChanged() {
	ch := make(chan struct{})
	close(*r.routeCh.Swap(&ch))
}

// rebuildByLeaseLocked indexes the members by lease and drops connections
// to addresses that left.
func (r *Runner) rebuildByLeaseLocked() map[string]bool {
	clear(r.byLease)
	live := make(map[string]bool, len(r.members))
	for _, m := range r.members {
		r.byLease[m.Lease] = m
		if m.Address != "" {
			live[m.Address] = true
		}
	}
	return live
}
