package routing

import (
	"cmp"
	"context"
	"errors"
	"strings"

	"go.opentelemetry.io/otel/trace"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/tracing"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/transport"
)

// Traces of the calls (Config.Tracer). While tracing is on, a Send runs
// in a client span (every attempt of it, local or remote, with an event
// for each retry), a remote attempt carries the span's context in its
// request's headers (the propagator's), and the receiving runner answers
// it in a server span, a child of the sender's; the handler's span is
// package hosting's. While it is off, Send and Deliver test Tracer.On
// once and take the paths they took before tracing existed.

// clientSpan is the span of one traced Send.
type clientSpan struct {
	span     trace.Span
	rec      bool // span.IsRecording(): attributes are built
	attempts int
	owner    string // the runner of the last attempt ("" when none was known)
	addr     string // its transport address ("" when local)
	ran      bool   // a handler ran the call (its outcome is the handler's)
}

// tried counts an attempt at owner (address addr; "" when local); ran
// says that a handler ran it.
func (cs *clientSpan) tried(owner, addr string, ran bool) {
	cs.attempts++
	cs.owner, cs.addr = owner, addr
	cs.ran = cs.ran || ran
}

// retry records that the last attempt, which failed with err before any
// handler ran it, is tried again. A nil cs records nothing.
func (cs *clientSpan) retry(err error) {
	if cs == nil || !cs.rec {
		return
	}
	cs.span.AddEvent(tracing.EventRetry, trace.WithAttributes(
		tracing.KeyAttempt.Int(cs.attempts), tracing.KeyOwner.String(cs.owner),
		tracing.KeyRetryReason.String(tracing.Text(err.Error()))))
}

// unknownCallName names the server span of a request for a kind or
// method this runner does not know.
const unknownCallName = "unknown kind or method"

// callNames are the names of client spans, by handler.
var callNames tracing.Names[*entity.Handler]

// sendTraced is Send in a client span.
func (r *Router) sendTraced(ctx context.Context, c entity.Call) (any, error) {
	kind, method := "?", "?"
	if c.Kind != nil {
		kind = c.Kind.Name()
	}
	if c.Handler != nil {
		method = c.Handler.Name()
	}
	var name string
	if c.Handler != nil && c.Kind != nil && c.Handler.Kind() == kind {
		name = callNames.Get(c.Handler, func() string { return kind + "/" + method })
	} else {
		name = kind + "/" + method
	}
	tr := r.cfg.Tracer
	ctx, span := tr.Start(ctx, name, tracing.ClientSpan...)
	cs := &clientSpan{span: span, rec: span.IsRecording()}
	if cs.rec {
		span.SetAttributes(tracing.Call(kind, method, c.Entity, uint32(sharding.ShardOf(c.Entity, r.cfg.NumShards)))...)
		span.SetAttributes(tr.Runner(), tracing.KeyOneWay.Bool(c.Handler != nil && c.Handler.OneWay()))
	}
	v, err := r.send(ctx, &c, cs)
	if cs.rec {
		span.SetAttributes(tracing.KeyAttempts.Int(cs.attempts), tracing.KeyOwner.String(cs.owner))
		if cs.addr != "" {
			span.SetAttributes(tracing.Server(cs.addr)...)
		}
	}
	tracing.End(span, err, func(err error) string { return errorType(err, cs.ran) })
	return v, err
}

// deliverTraced is Receiver.Deliver in a server span, a child of the
// span whose context the request's headers carry.
func (rc Receiver) deliverTraced(ctx context.Context, req *transport.DeliverRequest) (*transport.DeliverResponse, *hosting.Shard) {
	tr := rc.r.cfg.Tracer
	ctx = tr.Extract(ctx, req.Headers)
	var name string
	if k := rc.r.host.Kind(req.Kind); k != nil {
		if h, ok := k.Desc.Handler(req.Method); ok {
			name = callNames.Get(h, func() string { return req.Kind + "/" + req.Method })
		}
	}
	if name == "" {
		// A kind or method unknown here: one fixed name, so that a peer
		// cannot make span names without bound; its text is in the
		// attributes.
		name = unknownCallName
	}
	ctx, span := tr.Start(ctx, name, tracing.ServerSpan...)
	if span.IsRecording() {
		span.SetAttributes(tracing.Call(req.Kind, req.Method, req.Entity, req.Shard)...)
		span.SetAttributes(tr.Runner(), tracing.KeySender.String(tracing.Text(req.Sender)), tracing.KeyOneWay.Bool(req.OneWay))
	}
	resp, sh := rc.deliverTo(ctx, req, true)
	if resp.Epoch != 0 && span.IsRecording() {
		span.SetAttributes(tracing.KeyEpoch.Int64(int64(resp.Epoch)))
	}
	var err error
	if resp.Code != transport.CodeOK {
		err = errors.New(cmp.Or(resp.Message, resp.Code.String()))
	}
	tracing.End(span, err, func(error) string { return strings.ToLower(resp.Code.String()) })
	return resp, sh
}

// errorType classifies a Send's outcome for its span's error.type; ran
// says that a handler ran the call.
func errorType(err error, ran bool) string {
	var re *RemoteError
	switch {
	case errors.Is(err, hosting.ErrMaybeDelivered), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return hosting.ErrorType(err)
	case errors.Is(err, ErrNoOwner):
		return "no_owner"
	case errors.Is(err, ErrTooManyWaiting):
		return "too_many_waiting"
	case errors.Is(err, ErrNoTransport):
		return "no_transport"
	case errors.Is(err, transport.ErrNotSent):
		return "not_sent"
	case errors.Is(err, transport.ErrMessageTooLarge):
		return "too_large"
	case errors.As(err, &re):
		return "handler_error"
	}
	t := hosting.ErrorType(err)
	if t == "handler_error" && !ran {
		return "error" // the runtime's, before any handler: a closed runner, say
	}
	return t
}
