package routing

import (
	"errors"
	"fmt"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/transport"
)

// ErrorResponse maps a delivery error to the wire. sent says whether the
// message may have reached a handler.
func ErrorResponse(err error, sent bool) *transport.DeliverResponse {
	var (
		no    *hosting.NotOwnerError
		ud    *hosting.UndeliveredError
		pe    *entity.PanicError
		stale *hosting.StaleResultError
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
	case errors.Is(err, hosting.ErrDetached):
		return transport.CauseDetached
	case errors.Is(err, hosting.ErrShardMoved):
		return transport.CauseShardMoved
	case errors.Is(err, hosting.ErrShutdown):
		return transport.CauseShutdown
	}
	return transport.CauseUnspecified
}

// causeErr maps a wire cause back to the runner's error.
func causeErr(c transport.Cause) error {
	switch c {
	case transport.CauseDetached:
		return hosting.ErrDetached
	case transport.CauseShardMoved:
		return hosting.ErrShardMoved
	case transport.CauseShutdown:
		return hosting.ErrShutdown
	}
	return errors.New("runner: not delivered")
}

// ResponseError maps a response from owner back to a typed error; retry
// reports whether the message certainly was not delivered.
func ResponseError(owner string, req *transport.DeliverRequest, resp *transport.DeliverResponse) (err error, retry bool) {
	switch resp.Code {
	case transport.CodeOK:
		return nil, false
	case transport.CodeNotOwner:
		return &hosting.NotOwnerError{Shard: sharding.ShardID(resp.Shard), OwnerHint: resp.OwnerHint}, true
	case transport.CodeUndelivered:
		return &hosting.UndeliveredError{Shard: sharding.ShardID(resp.Shard), Cause: causeErr(resp.Cause)}, true
	case transport.CodeMailboxFull:
		return fmt.Errorf("%w (on %s): %s", entity.ErrMailboxFull, owner, resp.Message), false
	case transport.CodeUnknownKind:
		return fmt.Errorf("%w (on %s): %s", entity.ErrUnknownKind, owner, resp.Message), false
	case transport.CodeUnknownMethod:
		return fmt.Errorf("%w (on %s): %s", entity.ErrUnknownMethod, owner, resp.Message), false
	case transport.CodeTooLarge:
		return fmt.Errorf("%w (on %s): %s", transport.ErrMessageTooLarge, owner, resp.Message), false
	case transport.CodeBadRequest:
		return fmt.Errorf("%w (on %s): %s", entity.ErrBadRequest, owner, resp.Message), false
	case transport.CodeHandlerPanic:
		return &entity.PanicError{Kind: req.Kind, Method: req.Method, Entity: req.Entity, Value: resp.Message}, false
	case transport.CodeStaleResult:
		return &hosting.StaleResultError{Shard: sharding.ShardID(req.Shard), Runner: owner, Epoch: storage.Epoch(resp.Epoch), Reason: resp.Message, Cause: causeErr(resp.Cause)}, false
	default:
		return &RemoteError{Runner: owner, Message: resp.Message}, false
	}
}
