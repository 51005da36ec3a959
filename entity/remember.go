package entity

import (
	"context"
	"fmt"
)

// RememberMethod is the name of the built-in method every kind with the
// Remembered option answers: Remember sends it. It cannot be defined by a
// kind.
const RememberMethod = "shardhost.remember"

// Remember makes entity id of kind k remembered without a message of its
// own: the call is routed, like any call, to the owner of the entity's
// shard (s is the runner, or runner.SenderFrom(ctx) in a handler), which
// activates the entity if it is not running (ActivateNew) and records it
// exactly as a first activation does — one marker, written fenced by the
// shard's epoch, batched with the other shards' — and returns once the
// marker is in the store. From then on the shard's owners keep the entity
// running (see Remembered) until it calls Forget.
//
// It is idempotent: remembering an entity already remembered writes
// nothing, and the call is sent again after a connection lost after
// sending (ErrMaybeDelivered), like an Idempotent method. It fails with
// ErrNotRemembered for a kind without the Remembered option, the runner's
// unknown-kind error for a kind it has not registered, and with the
// routing's errors (Send's contract) when no owner answers before ctx
// ends. The request is an empty struct encoded with the kind's codec.
func Remember(ctx context.Context, s Sender, k Descriptor, id string) error {
	if !k.Options().Remembered {
		return fmt.Errorf("%w: %s %q: remember", ErrNotRemembered, k.Name(), id)
	}
	h, ok := k.Handler(RememberMethod)
	if !ok {
		return fmt.Errorf("%w: %s %q: the kind does not answer %s (only *Kind defines it)", ErrNotRemembered, k.Name(), id, RememberMethod)
	}
	_, err := s.Send(ctx, Call{Kind: k, Handler: h, Entity: id, Req: rememberReq{}})
	return err
}

// rememberReq is the request and the response of RememberMethod.
type rememberReq struct{}

// rememberAwaiter is implemented by a runtime that keeps remembered
// entities: AwaitRemembered returns once the entity's marker is stored.
type rememberAwaiter interface {
	AwaitRemembered(ctx context.Context) error
}

// rememberHandler is RememberMethod of kind: the entity is activated by its
// delivery; the handler waits for its marker.
func rememberHandler(kind string) *Handler {
	// Empty both ways (Handler.noPayload): whatever was sent decodes as
	// the empty request.
	dec := func(Codec, []byte) (any, error) { return rememberReq{}, nil }
	return &Handler{
		kind: kind, name: RememberMethod, idempotent: true, noPayload: true,
		invoke: func(_ any, ctx context.Context, _ any) (any, error) {
			rt, ok := RuntimeFrom(ctx)
			if !ok {
				return rememberReq{}, ErrNoEntity
			}
			aw, ok := rt.(rememberAwaiter)
			if !ok {
				return rememberReq{}, fmt.Errorf("%w: the runtime keeps no remembered entities", ErrNotRemembered)
			}
			return rememberReq{}, aw.AwaitRemembered(ctx)
		},
		decReq: dec,
		decRsp: dec,
	}
}
