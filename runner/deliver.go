package runner

import (
	"context"
	"errors"
	"fmt"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/hosting"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/transport"
)

// Errors of remote delivery (the transport's, under the runner's names).
var (
	// ErrMessageTooLarge: a request or response exceeds MaxMessageSize.
	// A too-large request is never sent.
	ErrMessageTooLarge = transport.ErrMessageTooLarge
	// ErrMaybeDelivered: the connection to the owner failed after the
	// message was sent, or the caller's context ended while it waited;
	// the handler may or may not have run. Not retried.
	ErrMaybeDelivered = transport.ErrMaybeDelivered
	// ErrNotSent: the owner could not be reached before sending (no
	// connection). Retried until the caller's context ends.
	ErrNotSent = transport.ErrNotSent
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

// receiver is the runner's side of its transport (transport.Handler).
type receiver struct{ r *Runner }

// Deliver answers a delivery and shows the answer to the test hook. The
// transport calls written once the answer is written to the connection.
func (rc receiver) Deliver(ctx context.Context, req *transport.DeliverRequest) (resp *transport.DeliverResponse, written func()) {
	resp, written = rc.r.deliverHere(ctx, req)
	if hook := rc.r.onServe.Load(); hook != nil {
		(*hook)(req, resp)
	}
	return resp, written
}

// Hot lists the shard's resident entities, most recently used first.
func (rc receiver) Hot(shard uint32, limit int) []transport.EntityRef {
	keys := rc.r.hosting.Hot(sharding.ShardID(shard), limit)
	out := make([]transport.EntityRef, len(keys))
	for i, k := range keys {
		out[i] = transport.EntityRef{Kind: k.Kind, ID: k.ID}
	}
	return out
}

func nothing() {}

// deliverHere is the receiving side: local delivery only, never a second
// hop. Every outcome is an answer (a Code), never a transport error.
func (r *Runner) deliverHere(ctx context.Context, req *transport.DeliverRequest) (*transport.DeliverResponse, func()) {
	resp, sh := r.deliverTo(ctx, req)
	if sh == nil {
		return resp, nothing
	}
	return resp, sh.ReplyWritten
}

// deliverTo delivers req here; sh is the shard host whose replying count
// the answer is in (nil when not counted).
func (r *Runner) deliverTo(ctx context.Context, req *transport.DeliverRequest) (*transport.DeliverResponse, *hosting.Shard) {
	k := r.hosting.Kind(req.Kind)
	if k == nil {
		return &transport.DeliverResponse{Code: transport.CodeUnknownKind, Message: fmt.Sprintf("kind %q not registered on %s", req.Kind, r.cfg.ID)}, nil
	}
	h, ok := k.Desc.Handler(req.Method)
	if !ok {
		return &transport.DeliverResponse{Code: transport.CodeUnknownMethod, Message: fmt.Sprintf("%s.%s", req.Kind, req.Method)}, nil
	}
	codec := k.Opts.Codec
	switch {
	case req.Codec != "" && req.Codec != codec.Name():
		return &transport.DeliverResponse{Code: transport.CodeBadRequest, Message: fmt.Sprintf("codec %q, kind %q uses %q", req.Codec, req.Kind, codec.Name())}, nil
	case h.OneWay() != req.OneWay:
		return &transport.DeliverResponse{Code: transport.CodeBadRequest, Message: fmt.Sprintf("%s.%s: one-way mismatch", req.Kind, req.Method)}, nil
	}
	if len(req.Payload) > r.cfg.MaxMessageSize {
		return &transport.DeliverResponse{Code: transport.CodeTooLarge, Message: fmt.Sprintf("request of %d bytes (limit %d on %s)", len(req.Payload), r.cfg.MaxMessageSize, r.cfg.ID)}, nil
	}
	id := sharding.ShardOf(req.Entity, r.cfg.NumShards)
	if uint32(id) != req.Shard {
		return &transport.DeliverResponse{Code: transport.CodeBadRequest, Message: fmt.Sprintf("entity %q is shard %d here, %d at the sender: do all runners agree on NumShards?", req.Entity, id, req.Shard)}, nil
	}
	v, err := h.DecodeRequest(codec, req.Payload)
	if err != nil {
		return &transport.DeliverResponse{Code: transport.CodeBadRequest, Message: err.Error()}, nil
	}
	sh := r.hosting.Lookup(id)
	if sh == nil {
		return errorResponse(r.notHere(id), false), nil
	}
	res := sh.Deliver(ctx, k, h, req.Entity, v, req.OneWay, true)
	counted := sh
	if !res.Admitted || req.OneWay {
		counted = nil // not admitted, or a signal: not counted
	}
	if res.Err != nil {
		resp := errorResponse(res.Err, !res.Undelivered)
		resp.Epoch = uint64(res.Epoch)
		return resp, counted
	}
	if req.OneWay {
		return &transport.DeliverResponse{}, counted
	}
	b, err := codec.Marshal(res.V)
	if err != nil {
		return &transport.DeliverResponse{Code: transport.CodeHandlerError, Message: fmt.Sprintf("encode response: %v", err), Epoch: uint64(res.Epoch)}, counted
	}
	if len(b) > r.cfg.MaxMessageSize {
		return &transport.DeliverResponse{Code: transport.CodeTooLarge, Message: fmt.Sprintf("response of %d bytes (limit %d)", len(b), r.cfg.MaxMessageSize)}, counted
	}
	return &transport.DeliverResponse{Payload: b, Epoch: uint64(res.Epoch)}, counted
}

// errorResponse maps a delivery error to the wire. sent says whether the
// message may have reached a handler.
func errorResponse(err error, sent bool) *transport.DeliverResponse {
	var (
		no    *NotOwnerError
		ud    *UndeliveredError
		pe    *entity.PanicError
		stale *StaleResultError
	)
	switch {
	case !sent && errors.As(err, &no):
		return &transport.DeliverResponse{Code: transport.CodeNotOwner, Message: err.Error(), OwnerHint: no.OwnerHint, Shard: uint32(no.Shard)}
	case !sent && errors.As(err, &ud):
		return &transport.DeliverResponse{Code: transport.CodeUndelivered, Message: err.Error(), Shard: uint32(ud.Shard), Cause: causeOf(ud.Cause)}
	case !sent && errors.Is(err, entity.ErrMailboxFull):
		return &transport.DeliverResponse{Code: transport.CodeMailboxFull, Message: err.Error()}
	case !sent:
		return &transport.DeliverResponse{Code: transport.CodeUndelivered, Message: err.Error()}
	case errors.As(err, &stale):
		return &transport.DeliverResponse{Code: transport.CodeStaleResult, Message: stale.Reason, Shard: uint32(stale.Shard), Cause: causeOf(stale.Cause)}
	case errors.As(err, &pe):
		return &transport.DeliverResponse{Code: transport.CodeHandlerPanic, Message: pe.Value}
	default:
		return &transport.DeliverResponse{Code: transport.CodeHandlerError, Message: truncate(err.Error(), maxErrorMessage)}
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

func causeOf(err error) transport.Cause {
	switch {
	case errors.Is(err, ErrDetached):
		return transport.CauseDetached
	case errors.Is(err, ErrShardMoved):
		return transport.CauseShardMoved
	case errors.Is(err, ErrShutdown):
		return transport.CauseShutdown
	}
	return transport.CauseUnspecified
}

// causeErr maps a wire cause back to the runner's error.
func causeErr(c transport.Cause) error {
	switch c {
	case transport.CauseDetached:
		return ErrDetached
	case transport.CauseShardMoved:
		return ErrShardMoved
	case transport.CauseShutdown:
		return ErrShutdown
	}
	return errors.New("runner: not delivered")
}

// responseError maps a response from owner back to a typed error; retry
// reports whether the message certainly was not delivered.
func responseError(owner string, req *transport.DeliverRequest, resp *transport.DeliverResponse) (err error, retry bool) {
	switch resp.Code {
	case transport.CodeOK:
		return nil, false
	case transport.CodeNotOwner:
		return &NotOwnerError{Shard: sharding.ShardID(resp.Shard), OwnerHint: resp.OwnerHint}, true
	case transport.CodeUndelivered:
		return &UndeliveredError{Shard: sharding.ShardID(resp.Shard), Cause: causeErr(resp.Cause)}, true
	case transport.CodeMailboxFull:
		return fmt.Errorf("%w (on %s): %s", entity.ErrMailboxFull, owner, resp.Message), false
	case transport.CodeUnknownKind:
		return fmt.Errorf("%w (on %s): %s", entity.ErrUnknownKind, owner, resp.Message), false
	case transport.CodeUnknownMethod:
		return fmt.Errorf("%w (on %s): %s", entity.ErrUnknownMethod, owner, resp.Message), false
	case transport.CodeTooLarge:
		return fmt.Errorf("%w (on %s): %s", ErrMessageTooLarge, owner, resp.Message), false
	case transport.CodeBadRequest:
		return fmt.Errorf("%w (on %s): %s", entity.ErrBadRequest, owner, resp.Message), false
	case transport.CodeHandlerPanic:
		return &entity.PanicError{Kind: req.Kind, Method: req.Method, Entity: req.Entity, Value: resp.Message}, false
	case transport.CodeStaleResult:
		return &StaleResultError{Shard: sharding.ShardID(req.Shard), Runner: owner, Epoch: storage.Epoch(resp.Epoch), Reason: resp.Message, Cause: causeErr(resp.Cause)}, false
	default:
		return &RemoteError{Runner: owner, Message: resp.Message}, false
	}
}
