package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/registration"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Starting up: what Run does before the runner is ready, and what a user
// sees meanwhile.
//
//   - The cluster record. Before registering (hosting) or routing
//     (client-only), a runner checks its NumShards and Strategy against
//     the cluster record, publishing it if there is none (see
//     checkCluster). A mismatch ends Run with a *ClusterMismatchError.
//   - Store failures at start are retried with backoff; the first is
//     logged at WARN with the store's endpoints and the error, then one
//     WARN a minute (startState.failed). A connection refused (or a DNS or TLS
//     failure) is reported at once, not after the first call's OpTimeout
//     (startState.probe). A call that found the store unavailable
//     is explained by the connection's own error when the store can say
//     it (connectionDiagnoser: refused, DNS, TLS), and Status and the debug
//     page say "not started: etcd ... unreachable since ...".
//     Config.StartTimeout (default DefaultStartTimeout) ends Run with
//     ErrStartTimeout when the runner is not ready in time.
//   - A store that refuses the runner's credentials or permissions
//     (storage.ErrPermissionDenied) ends Run at once with that error,
//     logged at ERROR (startRefused): no retry succeeds until an operator
//     acts. Refused later, while running, the runner detaches (as for any
//     storage error) and stays detached, re-trying once per RecoverWindow
//     of health (reattachFailed).
//   - Ready is closed once a hosting runner registered for the first time,
//     or a client-only runner listed the runners.
//   - A send made before Run is called waits for Run (sends after Shutdown
//     or Close fail at once; see waitRun).
//   - A hosting runner without a transport address fails Run with
//     ErrNoTransport once the cluster holds a runner of another process
//     for a second (guardTransport).

// startWarnEvery is how often a start that keeps failing is logged at WARN.
const startWarnEvery = time.Minute

// connectionDiagnoser is implemented by stores that can say why they
// cannot reach their servers in the connection's words (storage/etcd: a
// refused connection, a failed DNS lookup or TLS handshake) when a call
// only says that its deadline passed.
type connectionDiagnoser interface {
	ConnectionError(ctx context.Context) error
}

// diagnoseTimeout bounds the store's connection diagnosis after a failed
// start call: a refused connection, a DNS or TLS failure is known in
// milliseconds; an endpoint that drops packets says nothing in any time.
const diagnoseTimeout = time.Second

// localIncarnations holds the incarnations of the runners made in this
// process (by New): runners of one process may do without a transport.
var localIncarnations sync.Map // incarnation -> struct{}

// startState is what the runner knows of its start, and how it reports a
// start that fails (start_failures.go). Its own mutex: it is read on the
// send path (noRoute) and written by store calls.
type startState struct {
	runCalled chan struct{} // closed when Run is called
	ready     chan struct{} // closed once ready
	readyOnce sync.Once

	// Set by init, read-only afterwards: what the reports name and count.
	store                   storage.Store
	log                     *slog.Logger
	met                     *metrics
	opTimeout, startTimeout time.Duration

	mu        sync.Mutex
	clusterOK bool      // the cluster record agrees with this runner
	failures  int       // failed store calls since the start (or the last success)
	firstFail time.Time // of the current streak
	lastWarn  time.Time
	lastErr   error     // the last failure, until ready
	denied    int       // calls of a detached runner refused for permissions (refusedWhileDetached)
	deniedLog time.Time // when one was last logged at ERROR
}

func (s *startState) init(store storage.Store, log *slog.Logger, met *metrics, cfg Config) {
	s.store, s.log, s.met = store, log, met
	s.opTimeout, s.startTimeout = cfg.OpTimeout, cfg.StartTimeout
	s.runCalled = make(chan struct{})
	s.ready = make(chan struct{})
}

// Ready returns a channel that is closed once the runner is up: a hosting
// runner once it has checked the cluster record and registered (its first
// registration; it acquires its shards after that), a client-only runner
// once it has checked the cluster record and listed the runners. It is not
// closed if Run fails first (ErrStartTimeout, *ClusterMismatchError,
// ErrDuplicateRunnerID, ...): wait for it together with Run's return.
//
//	errc := make(chan error, 1)
//	go func() { errc <- r.Run(ctx) }()
//	select {
//	case <-r.Ready():
//	case err := <-errc:
//		log.Fatal(err)
//	}
func (r *Runner) Ready() <-chan struct{} { return r.st.ready }

// setReady closes Ready (once) and logs a recovery from start failures.
func (s *startState) setReady() {
	s.readyOnce.Do(func() {
		s.mu.Lock()
		n, since := s.failures, time.Since(s.firstFail)
		s.failures, s.lastErr = 0, nil
		s.mu.Unlock()
		if n > 0 {
			s.log.Info("store reachable; runner ready", "failed_attempts", n, "after", since.Round(time.Millisecond))
		}
		close(s.ready)
	})
}

// endpoints names the store's endpoints for logs ("" when it has none to
// name, as the in-memory store).
func (s *startState) endpoints() string {
	if e, ok := s.store.(interface{ Endpoints() []string }); ok {
		return strings.Join(e.Endpoints(), ",")
	}
	return ""
}

// checkStreams asks the store, before the runner opens any watch, whether
// its server holds a call's stream beside the watches' (the etcd store's
// CheckStreams): a *storage.StreamLimitError ends Run at once, since
// every call would otherwise time out for as long as the runner retries.
// A starved process can make one check's read time out with the watch
// open and succeed after it, as a limit does; so the limit is reported
// only once streamChecks checks said so, each within OpTimeout (a limit
// says so every time). A check that could not tell (the server
// unreachable, or too slow for AttemptTimeout) is made again, up to
// streamChecks times; then the runner starts, and its start calls report
// what they find.
func (r *Runner) checkStreams(ctx context.Context) error {
	c, ok := r.store.(interface{ CheckStreams(context.Context) error })
	if !ok {
		return nil
	}
	var limit, unknown error
	for limits, unknowns := 0, 0; limits < streamChecks; {
		cctx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
		err := c.CheckStreams(cctx)
		cancel()
		switch {
		case err == nil || ctx.Err() != nil:
			return nil
		case errors.Is(err, storage.ErrStreamLimit):
			limits++
			limit = err
		default:
			unknowns++
			unknown = err
		}
		if unknowns == streamChecks {
			r.log.Debug("could not check the store's concurrent streams; starting", "err", unknown)
			return nil
		}
	}
	r.log.Error("the store serves too few concurrent streams; not starting", "err", limit)
	return limit
}

// streamChecks is how many checks must find the stream limit, and how many
// that could not tell end the checking.
const streamChecks = 3

// startup runs, as one of Run's goroutines, what a start needs besides the
// watchdog's registration: the StartTimeout, the client-only runner's
// cluster check and readiness, and the transport guard.
func (r *Runner) startup(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	if r.cfg.StartTimeout > 0 {
		wg.Go(func() { r.startTimeout(ctx) })
	}
	wg.Go(func() { r.st.probe(ctx) })
	if r.cfg.ClientOnly {
		wg.Go(func() { r.startClient(ctx) })
	} else if r.Address() == "" {
		wg.Go(func() { r.guardTransport(ctx) })
	}
}

// startTimeout ends Run with ErrStartTimeout unless the runner is ready
// within Config.StartTimeout (none when it is negative).
func (r *Runner) startTimeout(ctx context.Context) {
	t := time.NewTimer(r.cfg.StartTimeout)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-r.st.ready:
	case <-t.C:
		err := fmt.Errorf("%w (%v)", ErrStartTimeout, r.cfg.StartTimeout)
		if last := r.st.lastError(); last != nil {
			err = fmt.Errorf("%w: last failure: %w", err, last)
		}
		attrs := []any{"err", err}
		if eps := r.st.endpoints(); eps != "" {
			attrs = append(attrs, "endpoints", eps)
		}
		r.log.Error("not ready within StartTimeout; stopping", attrs...)
		r.failRun(err)
	}
}

// startClient checks the cluster record for a client-only runner
// (retrying store failures) and marks it ready once the runners are
// listed.
func (r *Runner) startClient(ctx context.Context) {
	backoff := r.cfg.ProbeInterval
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	for {
		err := r.verifyCluster(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrClusterMismatch) {
			r.log.Error("configuration differs from the cluster's; stopping", "err", err)
			r.failRun(err)
			return
		}
		switch {
		case errors.Is(err, storage.ErrPermissionDenied) && mayReadCluster(ctx, r.store, r.cfg.OpTimeout):
			r.st.failed("check the cluster record (this client-only runner may only read it: "+
				"waiting for a hosting runner to publish it)", err, backoff)
		case r.startRefused("check the cluster record", err):
			return
		default:
			r.st.failed("check the cluster record", err, backoff)
		}
		t.Reset(backoff)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	for {
		changed := r.router.RouteWatch()
		r.mu.Lock()
		listed := r.view.membersSeen
		r.mu.Unlock()
		if listed {
			r.st.setReady()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// clusterChecked reports whether the cluster record was found to agree
// with this runner's configuration.
func (s *startState) clusterChecked() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clusterOK
}

// verifyCluster checks the cluster record once per Run (see checkCluster).
func (r *Runner) verifyCluster(ctx context.Context) error {
	if r.st.clusterChecked() {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
	defer cancel()
	if err := r.checkCluster(cctx); err != nil {
		return err
	}
	r.st.mu.Lock()
	r.st.clusterOK = true
	r.st.mu.Unlock()
	return nil
}

// checkCluster compares this runner's NumShards, coordination layout and
// (hosting runners) Strategy with the cluster record
// (registration.CheckCluster).
// A ClientOnly runner then routes by the record's strategy
// (useClusterStrategy).
func (r *Runner) checkCluster(ctx context.Context) error {
	want := storage.ClusterRecord{NumShards: r.cfg.NumShards, WrittenBy: r.cfg.ID, Layout: storage.Layout}
	if !r.cfg.ClientOnly {
		want.Strategy = r.cfg.Strategy.Name()
	}
	info, err := registration.CheckCluster(ctx, r.store, want, r.log)
	if err == nil && r.cfg.ClientOnly {
		r.useClusterStrategy(info.Strategy)
	}
	return err
}

// foreignMemberGrace is how long a runner of another process must stay in
// the membership before a hosting runner without a transport gives up: a
// record damaged for a moment (and repaired by its owner) is no such
// runner.
const foreignMemberGrace = time.Second

// guardTransport ends Run with ErrNoTransport when this hosting runner,
// which serves no transport, shares its cluster with a runner of another
// process (for foreignMemberGrace): that runner could not reach the shards
// owned here.
func (r *Runner) guardTransport(ctx context.Context) {
	seen := ^uint64(0)
	var suspect *storage.Runner // a foreign member seen, waiting for the grace to pass
	grace := time.NewTimer(time.Hour)
	grace.Stop()
	defer grace.Stop()
	for {
		changed := r.router.RouteWatch()
		r.mu.Lock()
		version := r.view.membersVersion
		foreign := r.view.foreignMember(r.cfg.ID)
		r.mu.Unlock()
		if version != seen {
			seen = version
			switch {
			case foreign == nil:
				suspect = nil
				grace.Stop()
			case suspect == nil || suspect.Incarnation != foreign.Incarnation:
				suspect = foreign
				grace.Reset(foreignMemberGrace)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
			continue
		case <-grace.C:
		}
		r.mu.Lock()
		foreign = r.view.foreignMember(r.cfg.ID)
		r.mu.Unlock()
		if foreign == nil || suspect == nil || foreign.Incarnation != suspect.Incarnation {
			suspect = nil
			seen = ^uint64(0) // decide again on the current view
			continue
		}
		err := fmt.Errorf("%w: runner %q of another process (incarnation %s, address %q) is in the cluster, "+
			"and this hosting runner serves no transport, so it could not reach the shards owned here: "+
			"set Config.ListenAddr (and Address), or ClientOnly", ErrNoTransport, foreign.ID, foreign.Incarnation, foreign.Address)
		r.log.Error("hosting without a transport in a cluster of several processes; stopping", "err", err)
		r.failRun(err)
		return
	}
}

// runCallGrace is how long a send made before Run was called waits for
// the call: long enough for `go r.Run(ctx)` started just before the send
// to get going, short enough that a runner nobody starts fails fast.
const runCallGrace = time.Second

// waitRun is admission for a runner that is not running: a send made
// before Run is called waits for the call (bounded by ctx and
// runCallGrace), then, once Run runs, for the runner as any send does;
// after Shutdown, Close or Run's return, or when Run is not called in
// time, it fails with ErrClosed.
func (r *Runner) waitRun(ctx context.Context) error {
	r.mu.Lock()
	waiting := r.lifecycle.phase == phaseNew // neither Run nor Shutdown or Close yet
	r.mu.Unlock()
	if waiting {
		t := time.NewTimer(runCallGrace)
		defer t.Stop()
		select {
		case <-r.st.runCalled:
		case <-r.sig.stopReq:
		case <-r.sig.closeReq:
		case <-ctx.Done():
			return fmt.Errorf("runner %s: waiting for Run to be called: %w", r.cfg.ID, hosting.ContextError(ctx))
		case <-t.C:
			return fmt.Errorf("%w: runner %s: Run was not called (waited %v)", ErrClosed, r.cfg.ID, runCallGrace)
		}
	}
	if r.running.Load() {
		// Run began, perhaps after the caller saw "not running" (`go r.Run`
		// then a send): the send goes on, not refused as if Run had returned.
		return nil
	}
	return r.closedErr()
}

// closedErr is the error of a send to a runner that is not running.
func (r *Runner) closedErr() error {
	r.mu.Lock()
	why := "Shutdown or Close was called before Run"
	if r.lifecycle.ran() {
		why = "Run has returned"
	}
	r.mu.Unlock()
	if err := r.fatalErr(); err != nil {
		return fmt.Errorf("%w: runner %s stopped: %w", ErrClosed, r.cfg.ID, err)
	}
	return fmt.Errorf("%w: runner %s: %s", ErrClosed, r.cfg.ID, why)
}

// noOwnerReason says why no owner of shard id is known, for ErrNoOwner:
// this runner has not listed the cluster (with the last store failure),
// no runner is registered, or the shard has been without a known owner
// for as long as the send waited (with who holds its lock, if anyone).
func (r *Runner) noOwnerReason(id sharding.ShardID, waited time.Duration) string {
	r.mu.Lock()
	listed, members, phase := r.view.membersSeen, len(r.view.members), r.lifecycle.phase
	l, held := r.view.locks.Get(id)
	_, holderKnown := r.view.byLease[l.Lease]
	assigned := r.view.assignment.Of(id)
	r.mu.Unlock()
	failure := ""
	if err := r.st.lastError(); err != nil {
		failure = fmt.Sprintf(" (last store failure: %v)", err)
	}
	w := waited.Round(time.Millisecond)
	switch {
	case !listed:
		return "this runner has not listed the cluster's runners yet" + failure
	case members == 0 && phase == phaseStarting:
		return "no runner is registered in the cluster, and this one has not registered yet" + failure
	case members == 0:
		return "no runner is registered in the cluster"
	case held && !holderKnown:
		return fmt.Sprintf("its lock is held under lease %x, of no registered runner (a runner that is gone; its lease expires), for the %v this send waited", l.Lease, w)
	case assigned != "":
		return fmt.Sprintf("unowned for the %v this send waited (%d runners registered; assigned to %q, which has not acquired it)", w, members, assigned)
	default:
		return fmt.Sprintf("unowned for the %v this send waited (%d runners registered, none holds its lock)", w, members)
	}
}
