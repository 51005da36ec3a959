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
// open and once after: a read that times out while the watch is open but
// succeeds without it is reported as the limit. It returns nil only when
// the read beside the open watch succeeded. Any other error says the check
// could not tell — the first read or the one after the watch failed (the
// server unreachable, or slow: a fresh connection on a starved machine
// can take longer than AttemptTimeout), or the watch was not created in
// time — and the caller may check again.
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
		return errors.New("etcd: stream check: the first read failed")
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.cli.Watch(wctx, s.prefix+"ping", clientv3.WithCreatedNotify())
	wait := time.NewTimer(s.attemptTimeout)
	defer wait.Stop()
	select {
	case wr, ok := <-wch:
		if !ok || !wr.Created {
			return errors.New("etcd: stream check: the watch was not created")
		}
	case <-wait.C:
		return errors.New("etcd: stream check: the watch was not created within AttemptTimeout")
	case <-ctx.Done():
		return ctx.Err()
	}
	ok, blocked := read()
	cancel()
	switch {
	case ok:
		return nil
	case !blocked:
		return errors.New("etcd: stream check: the read beside the watch failed")
	}
	if ok, _ := read(); !ok {
		return errors.New("etcd: stream check: the read after the watch failed")
	}
	return &storage.StreamLimitError{Endpoint: strings.Join(s.cli.Endpoints(), ","), Needed: streamsNeeded, Flag: "--max-concurrent-streams"}
}
