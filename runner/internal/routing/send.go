package routing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/transport"
)

// attempt is the state of one call across its routing attempts.
type attempt struct {
	k       *hosting.Kind
	h       *entity.Handler
	id      sharding.ShardID
	c       entity.Call
	payload []byte // encoded once, on the first remote attempt
	hint    string // owner named by the last NotOwner answer
	start   time.Time
	badReq  bool        // the request cannot be encoded: returned at once
	cs      *clientSpan // nil: not traced
	routed  string      // the owner the lock watch named at the last remote attempt ("" none)
	// assignee is the runner this attempt went to as the shard's assignee
	// (no live owner known; "" none); refused is one that failed such an
	// attempt (not owner, not reachable), not tried again before the
	// back-off's next step — a routing change alone retries the lock view.
	assignee, refused string
	seen              ViewSeen // with assignee: the views that named it
	dest              string   // the runner the last remote attempt went to
}

// callRoute is the route of one remote attempt (transport.Route): routed
// is the owner the lock watch named ("" none), dest the runner sent to
// (the watch's owner or the last answer's hint). Pooled (Router.routes):
// the transport keeps none after its call returns.
type callRoute struct {
	r      *Router
	id     sharding.ShardID
	routed string
	dest   storage.Runner
}

var _ transport.Route = (*callRoute)(nil)

// Changed implements transport.Route.
func (c *callRoute) Changed() <-chan struct{} { return c.r.RouteWatch() }

// Current implements transport.Route: the attempt's destination is still
// the one routing would choose — the watch's owner of the shard, at the
// same address; or, for an attempt sent to an answer's hint, the watch's
// view of the shard unchanged and the hinted runner still a member at
// that address. A runner that is gone (its lock moved, its record or lease
// gone) is not current.
func (c *callRoute) Current() bool {
	owner, ok := c.r.dir.Route(c.id)
	if c.dest.ID == c.routed {
		return ok && owner.ID == c.dest.ID && owner.Address == c.dest.Address
	}
	routed := ""
	if ok {
		routed = owner.ID
	}
	m, known := c.r.dir.Member(c.dest.ID)
	return routed == c.routed && known && m.Address == c.dest.Address
}

// sendSlow is the routing loop with retries.
func (r *Router) sendSlow(ctx context.Context, k *hosting.Kind, h *entity.Handler, id sharding.ShardID, c entity.Call, last error, cs *clientSpan) (any, error) {
	var (
		waiting bool // counted in r.waiting (MaxWaitingSends)
		bo      *backoff.ExponentialBackOff
		timer   *time.Timer
		a       = attempt{k: k, h: h, id: id, c: c, start: time.Now(), cs: cs}
		routed  string // the watch's owner at the previous attempt
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for n := 0; ; n++ {
		changed := r.RouteWatch()
		v, err, sent := r.try(ctx, &a)
		if a.badReq {
			return nil, err
		}
		if err == nil || sent || !retryable(err) {
			if n > 0 {
				r.met.SendRetries.Add(context.Background(), int64(n), r.met.Attrs)
			}
			return v, err
		}
		if last == nil || !errors.Is(err, ErrNoOwner) || errors.Is(last, ErrNoOwner) {
			last = err // keep the most informative reason for the caller
		}
		var no *hosting.NotOwnerError
		if errors.As(err, &no) {
			if no.OwnerHint != "" && no.OwnerHint != r.cfg.RunnerID {
				a.hint = no.OwnerHint
			}
			if r.dir.ByAssignment() {
				r.dir.Learned(id, no.OwnerHint, a.dest)
			}
		}
		if a.assignee != "" {
			a.refused = a.assignee
		}
		if bo != nil && a.routed != routed {
			// The shard's route changed (a new owner, or none): the
			// back-off grown against the former one does not apply to it.
			bo.Reset()
		}
		routed = a.routed
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
			if !r.dir.Running() {
				return nil, fmt.Errorf("%w; %s %q not delivered (last attempt: %w)", r.dir.ClosedErr(), k.Desc.Name(), c.Entity, last)
			}
		case <-timer.C:
			a.refused = "" // the back-off's step: the assignee may serve now
		}
		cs.retry(err)
	}
}

// try makes one attempt: here if the shard is hosted here, else one hop
// to its owner (or the owner the last answer named). sent reports that a
// handler may have run it.
func (r *Router) try(ctx context.Context, a *attempt) (v any, err error, sent bool) {
	a.dest = ""
	if sh := r.host.Lookup(a.id); sh != nil {
		res := sh.Deliver(ctx, a.k, a.h, a.c.Entity, a.c.Req, a.h.OneWay(), false, a.cs != nil)
		if a.cs != nil {
			a.cs.tried(r.cfg.RunnerID, "", res.Epoch != 0)
		}
		return res.V, res.Err, !res.Undelivered
	}
	owner, ok := r.dir.Route(a.id)
	a.routed = ""
	if ok {
		a.routed = owner.ID
	}
	if a.hint != "" && a.hint != owner.ID {
		// The last receiver knew better than our watch: try its hint (one
		// hop again, never forwarded further).
		if m, known := r.dir.Member(a.hint); known && m.Address != "" {
			owner, ok = m, true
		}
	}
	a.hint = ""
	a.assignee = ""
	if !ok {
		// No live owner known (the lock deleted or its owner gone): the
		// runner the assignment names parks the request while it acquires
		// the shard, or answers NotOwner at once if it cannot serve it.
		if m, seen, found := r.dir.Assignee(a.id); found && m.ID != a.refused && (r.dir.ByAssignment() || !nearDeadline(ctx)) {
			owner, ok, a.assignee, a.seen = m, true, m.ID, seen
		}
	}
	if a.cs != nil {
		a.cs.tried(owner.ID, owner.Address, false)
	}
	a.dest = owner.ID
	switch {
	case !ok:
		return nil, r.dir.NoRoute(a.id, time.Since(a.start)), false
	case owner.Address == "":
		// The owner serves no transport: final, not retried.
		how := "owned by"
		if a.assignee != "" {
			how = "assigned to"
		}
		return nil, fmt.Errorf("%w: shard %d is %s runner %q, which serves no transport (its Config has neither ListenAddr nor Address), "+
			"so no other runner can reach its entities", ErrNoTransport, a.id, how, owner.ID), true
	}
	if a.payload == nil {
		if a.payload, err = a.h.Encode(a.k.Opts.Codec, a.c.Req); err != nil {
			a.badReq = true
			return nil, fmt.Errorf("%w: encode %s.%s request: %w", entity.ErrBadRequest, a.k.Desc.Name(), a.h.Name(), err), true
		}
	}
	return r.remote(ctx, owner, a)
}

// assigneeMinTime: an attempt at a shard's assignee (which parks it until
// the install, answering "not owner" some time before the caller's
// deadline) is made only with at least this much time left; a shorter one
// would end with the caller's deadline during the hop, which the caller
// could only take for "maybe delivered".
const assigneeMinTime = 100 * time.Millisecond

// nearDeadline reports whether ctx ends within assigneeMinTime.
func nearDeadline(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && time.Until(d) < assigneeMinTime
}

// remote delivers to the owner over the transport.
func (r *Router) remote(ctx context.Context, owner storage.Runner, a *attempt) (any, error, bool) {
	k, h := a.k, a.h
	req := &transport.DeliverRequest{
		Kind: k.Desc.Name(), Method: h.Name(), Entity: a.c.Entity, Payload: a.payload,
		OneWay: h.OneWay(), Shard: uint32(a.id), Sender: r.cfg.RunnerID, Codec: k.Opts.Codec.Name(),
	}
	if a.cs != nil {
		req.Headers = r.cfg.Tracer.Inject(ctx)
	}
	if a.assignee != "" {
		req.LocksSeen, req.RunnersSeen = uint64(a.seen.Locks), uint64(a.seen.Runners)
	}
	var (
		resp *transport.DeliverResponse
		sent bool
		err  error
	)
	if r.rc != nil {
		// A wait for a connection to owner gives way as soon as the shard's
		// route moves (the owner is gone, or another took the shard).
		rt := r.routes.Get().(*callRoute)
		*rt = callRoute{r: r, id: a.id, routed: a.routed, dest: owner}
		resp, sent, err = r.rc.CallRoute(ctx, owner.Address, req, rt)
		*rt = callRoute{}
		r.routes.Put(rt)
	} else {
		resp, sent, err = r.net.Call(ctx, owner.Address, req)
	}
	if err != nil {
		if sent {
			err = fmt.Errorf("to %s: %w", owner.ID, err)
		}
		return nil, err, sent
	}
	if resp.Epoch != 0 && a.cs != nil {
		a.cs.ran = true
	}
	if resp.Epoch != 0 && resp.Code != transport.CodeStaleResult {
		// A result (value, handler error or panic): withheld if it may
		// come from a former owner that lost the shard while it ran.
		if err := r.checkEpoch(ctx, a.id, owner, storage.Epoch(resp.Epoch)); err != nil {
			return nil, err, true
		}
	}
	if err, retry := ResponseError(owner.ID, req, resp); err != nil {
		return nil, err, !retry
	}
	if resp.Epoch != 0 && r.dir.ByAssignment() {
		r.dir.Learned(a.id, owner.ID, "") // it owns the shard: route there until it names another
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
// owner's lease, under which it held the shard, did not end by the owner's
// own drains (it expired, or was revoked after a detach: the shard may
// have been taken while the handler ran). A result from a live owner, or
// from one whose lease ended by a clean Shutdown, is accepted: such an
// owner gives a shard up only after its drain, in which every handler
// finished, so its result ran before the newer epoch began
// (Directory.LeaseEndsByDrain). The owner's own check (the detach instant
// and its shard's hosting, at the handler's end) covers the rest; this one
// closes the gap between that check and the socket write.
func (r *Router) checkEpoch(ctx context.Context, id sharding.ShardID, owner storage.Runner, epoch storage.Epoch) error {
	newer := storage.Epoch(0)
	if p := r.epochs.Peek(int(id)); p != nil {
		newer = storage.Epoch(p.Load())
	}
	if newer <= epoch {
		r.SawEpoch(id, epoch)
		return nil
	}
	if r.dir.LeaseEndsByDrain(owner.Lease) {
		return nil
	}
	r.met.Dropped.Add(context.Background(), 1, r.met.Attrs, hosting.WithReason(hosting.DropStaleResult))
	r.log.WarnContext(ctx, "result from an ended lease, older than an epoch already seen; withheld",
		"shard", id, "from", owner.ID, "epoch", epoch, "seen", newer)
	return &hosting.StaleResultError{Shard: id, Runner: owner.ID, Epoch: epoch, Newer: newer, Cause: hosting.ErrShardMoved}
}

// sendIdempotent sends c, a call of an entity.Idempotent method whose
// first attempt failed with ErrMaybeDelivered (first), again and again
// after every ErrMaybeDelivered — the connection to the owner failed after
// sending, or the owner withheld a stale result — with jittered
// exponential backoff, until an attempt succeeds or fails otherwise, or
// ctx ends. Then it returns ctx's error joined with the last attempt's.
// Every error it returns matches ErrMaybeDelivered: the first attempt may
// have run the call, whatever a later attempt's error says about itself.
// Running an idempotent handler more than once is harmless by definition.
func (r *Router) sendIdempotent(ctx context.Context, c entity.Call, first error, cs *clientSpan) (any, error) {
	last := first
	bo := newBackoff()
	timer := time.NewTimer(bo.NextBackOff())
	defer timer.Stop()
	for n := 1; ; n++ {
		r.log.DebugContext(ctx, "idempotent call may have run; sending it again", "kind", c.Kind.Name(), "method", c.Handler.Name(),
			"attempt", n, "err", last)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("runner: idempotent %s.%s %q: %w (last attempt: %w)",
				c.Kind.Name(), c.Handler.Name(), c.Entity, hosting.ContextError(ctx), last)
		case <-timer.C:
		}
		cs.retry(last)
		r.met.SendRetries.Add(context.Background(), 1, r.met.Attrs)
		v, err := r.sendOnce(ctx, &c, cs)
		switch {
		case err == nil:
			return v, nil
		case !errors.Is(err, hosting.ErrMaybeDelivered):
			// What this attempt's error proves (not delivered, say) is
			// about this attempt: an earlier one may have run the call.
			return nil, fmt.Errorf("%w (an earlier attempt may have been delivered: %w)", err, last)
		case ctx.Err() != nil:
			return nil, err
		}
		last = err
		timer.Reset(bo.NextBackOff())
	}
}
