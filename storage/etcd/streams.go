package etcd

import (
	"context"
	"errors"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/storage"
)

// streamsNeeded is how many gRPC streams a runner holds at once on its
// client's connection: one for all its watches (they carry the same
// metadata, so the client multiplexes them on one stream) and one for a
// call.
const streamsNeeded = 2

// CheckStreams reports, with a *storage.StreamLimitError, an etcd server
// whose --max-concurrent-streams lets the client's connection hold fewer
// than the streams a runner needs: with the watch stream open, a call
// then waits for a stream that never comes (each call fails with its
// deadline, and the runner never starts). It opens the watch stream (or
// joins the client's, as a runner's watches do), reads once while it is
// open and once after; only a read that times out while the watch is open
// but succeeds without it is reported. Other failures return nil: the
// start's calls report them.
func (s *Store) CheckStreams(ctx context.Context) error {
	// read reads once and reports whether it succeeded, or else timed out
	// by its own deadline.
	read := func() (ok, timedOut bool) {
		rctx, cancel := context.WithTimeout(ctx, s.attemptTimeout)
		defer cancel()
		_, err := s.cli.Get(rctx, s.prefix+"ping", clientv3.WithCountOnly())
		return err == nil, err != nil && ctx.Err() == nil && errors.Is(rctx.Err(), context.DeadlineExceeded)
	}
	if ok, _ := read(); !ok {
		return nil
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.cli.Watch(wctx, s.prefix+"ping", clientv3.WithCreatedNotify())
	wait := time.NewTimer(s.attemptTimeout)
	defer wait.Stop()
	select {
	case wr, ok := <-wch:
		if !ok || !wr.Created {
			return nil
		}
	case <-wait.C:
		return nil
	case <-ctx.Done():
		return nil
	}
	_, blocked := read()
	cancel()
	if !blocked {
		return nil
	}
	if ok, _ := read(); !ok {
		return nil
	}
	return &storage.StreamLimitError{Endpoint: strings.Join(s.cli.Endpoints(), ","), Needed: streamsNeeded, Flag: "--max-concurrent-streams"}
}
