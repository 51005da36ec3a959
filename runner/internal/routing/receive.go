package routing

import (
	"context"
	"fmt"

	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/transport"
)

// Receiver is the receiving side of remote delivery (a transport.Handler):
// local delivery only, never a second hop. Every outcome is an answer (a
// Code), never a transport error.
type Receiver struct{ r *Router }

// Receiver returns the receiving side of r.
func (r *Router) Receiver() Receiver { return Receiver{r} }

func nothing() {}

// Deliver answers a delivery. The transport calls written once the answer
// is written to the connection: an admitted ask counts in its shard's
// drain until then.
func (rc Receiver) Deliver(ctx context.Context, req *transport.DeliverRequest) (*transport.DeliverResponse, func()) {
	var (
		resp *transport.DeliverResponse
		sh   *hosting.Shard
	)
	if rc.r.cfg.Tracer.On() {
		resp, sh = rc.deliverTraced(ctx, req)
	} else {
		resp, sh = rc.deliverTo(ctx, req, false)
	}
	if sh == nil {
		return resp, nothing
	}
	return resp, sh.ReplyWrittenFunc()
}

// Hot lists the shard's resident entities, most recently used first.
func (rc Receiver) Hot(shard uint32, limit int) []transport.EntityRef {
	keys := rc.r.host.Hot(sharding.ShardID(shard), limit)
	out := make([]transport.EntityRef, len(keys))
	for i, k := range keys {
		out[i] = transport.EntityRef{Kind: k.Kind, ID: k.ID}
	}
	return out
}

// deliverTo delivers req here (in the server span ctx carries when
// traced); sh is the shard whose replying count the answer is in (nil
// when not counted).
func (rc Receiver) deliverTo(ctx context.Context, req *transport.DeliverRequest, traced bool) (*transport.DeliverResponse, *hosting.Shard) {
	r := rc.r
	k := r.host.Kind(req.Kind)
	if k == nil {
		return &transport.DeliverResponse{Code: transport.CodeUnknownKind, Message: fmt.Sprintf("kind %q not registered on %s", req.Kind, r.cfg.RunnerID)}, nil
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
		return &transport.DeliverResponse{Code: transport.CodeTooLarge, Message: fmt.Sprintf("request of %d bytes (limit %d on %s)", len(req.Payload), r.cfg.MaxMessageSize, r.cfg.RunnerID)}, nil
	}
	id := sharding.ShardOf(req.Entity, r.cfg.NumShards)
	if uint32(id) != req.Shard {
		return &transport.DeliverResponse{Code: transport.CodeBadRequest, Message: fmt.Sprintf("entity %q is shard %d here, %d at the sender: do all runners agree on NumShards?", req.Entity, id, req.Shard)}, nil
	}
	v, err := h.DecodeRequest(codec, req.Payload)
	if err != nil {
		return &transport.DeliverResponse{Code: transport.CodeBadRequest, Message: err.Error()}, nil
	}
	sh := r.host.Lookup(id)
	if sh == nil && r.dir.Park(ctx, id, ViewSeen{Locks: storage.Revision(req.LocksSeen), Runners: storage.Revision(req.RunnersSeen)}) {
		sh = r.host.Lookup(id) // installed while the request waited
	}
	if sh == nil {
		return ErrorResponse(r.dir.NotHere(id), false), nil
	}
	res := sh.Deliver(ctx, k, h, req.Entity, v, req.OneWay, true, traced)
	counted := sh
	if !res.Admitted || req.OneWay {
		counted = nil // not admitted, or a signal: not counted
	}
	if res.Err != nil {
		resp := ErrorResponse(res.Err, !res.Undelivered)
		resp.Epoch = uint64(res.Epoch)
		return resp, counted
	}
	resp := req.NewResponse() // no allocation for a request from a delivery stream
	if req.OneWay {
		return resp, counted
	}
	b, err := h.Encode(codec, res.V)
	if err != nil {
		return &transport.DeliverResponse{Code: transport.CodeHandlerError, Message: fmt.Sprintf("encode response: %v", err), Epoch: uint64(res.Epoch)}, counted
	}
	if len(b) > r.cfg.MaxMessageSize {
		return &transport.DeliverResponse{Code: transport.CodeTooLarge, Message: fmt.Sprintf("response of %d bytes (limit %d)", len(b), r.cfg.MaxMessageSize)}, counted
	}
	resp.Payload, resp.Epoch = b, uint64(res.Epoch)
	return resp, counted
}
