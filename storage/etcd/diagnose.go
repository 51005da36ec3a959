package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shardhost/shardhost/storage"
)

// ConnectionError says why the store cannot reach etcd, in the words of
// the connection rather than of the call that timed out: for each
// endpoint, the error its connection failed with (a refused connection, a
// failed DNS lookup, a failed TLS handshake), as gRPC reports it to a call
// that does not wait for a connection. Each endpoint is asked once,
// concurrently, through the store's own connection to it (the client's
// TLS, credentials and dial options), with a status request.
//
// It returns nil as soon as one endpoint answers, even with an error of
// etcd's own (it is reachable). An endpoint that neither answers nor fails
// before ctx ends — a black hole — is reported as not answering within the
// wait. The error matches storage.ErrUnavailable and reads, for one
// endpoint, "etcd unreachable: 127.0.0.1:2379: dial tcp 127.0.0.1:2379:
// connect: connection refused".
func (s *Store) ConnectionError(ctx context.Context) error {
	list, _, err := s.members.current()
	if err != nil {
		return fmt.Errorf("%w: etcd unreachable: %w", storage.ErrUnavailable, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(list))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		answered bool
	)
	for i, m := range list {
		wg.Go(func() {
			_, err := pb.NewMaintenanceClient(m.conn).Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(false))
			if reached(err) {
				mu.Lock()
				answered = true
				mu.Unlock()
				cancel() // one answer is enough
				return
			}
			errs[i] = fmt.Errorf("%s: %s", m.endpoint, connectionCause(err, ctx))
		})
	}
	wg.Wait()
	if answered {
		return nil
	}
	return fmt.Errorf("%w: etcd unreachable: %w", storage.ErrUnavailable, errors.Join(errs...))
}

// reached reports whether err came from a member that was connected to:
// nil, or an error that is not about the connection.
func reached(err error) bool {
	switch status.Code(err) {
	case codes.OK:
		return true
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return false
	default:
		return true // etcd answered (with an error of its own: auth, no leader, ...)
	}
}

// connectionCause is the connection's error in err, without gRPC's
// wrapping ("connection error: desc = \"transport: Error while dialing:
// dial tcp ...\""), or, when the wait ended first, says so.
func connectionCause(err error, ctx context.Context) string {
	st, ok := status.FromError(err)
	if !ok {
		return err.Error()
	}
	if st.Code() != codes.Unavailable {
		if ctx.Err() != nil {
			return "no answer and no connection error within the wait (packets dropped?)"
		}
		return st.Message()
	}
	msg := st.Message()
	msg = strings.TrimPrefix(msg, "connection error: desc = ")
	msg = strings.Trim(msg, `"`)
	msg = strings.TrimPrefix(msg, "transport: ")
	msg = strings.TrimPrefix(msg, "Error while dialing: ")
	msg = strings.TrimPrefix(msg, "error while dialing: ")
	return msg
}
