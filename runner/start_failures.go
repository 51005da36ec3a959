package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shardhost/shardhost/storage"
)

// failed records a failed store call of the start (op) and logs it:
// the first of a streak at WARN with the endpoints and the error, then at
// most one WARN per startWarnEvery, the rest at DEBUG.
func (s *startState) failed(op string, err error, retryIn time.Duration) {
	s.report(op, explainUnavailable(s.store, s.opTimeout, err), retryIn, false)
}

// probe asks the store, as Run begins, whether it can reach its
// servers at all, beside the first start call: a refused connection, a
// failed DNS lookup or TLS handshake is known in milliseconds, while that
// call waits for its OpTimeout before it fails. The first report (WARN,
// Status().NotStarted) then comes at once. A store that answers, or says
// nothing within OpTimeout (packets dropped), is left to the start calls.
func (s *startState) probe(ctx context.Context) {
	d, ok := s.store.(connectionDiagnoser)
	if !ok {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	err := d.ConnectionError(pctx)
	if err == nil || pctx.Err() != nil {
		return
	}
	select {
	case <-s.ready:
		return
	default:
	}
	s.report("connect", err, 0, true)
}

// report is failed once err is explained; with onlyFirst
// it reports nothing when a failure was already recorded.
func (s *startState) report(op string, err error, retryIn time.Duration, onlyFirst bool) {
	now := time.Now()
	s.mu.Lock()
	if onlyFirst && s.failures > 0 {
		s.mu.Unlock()
		return
	}
	s.failures++
	s.lastErr = err
	first := s.failures == 1
	if first {
		s.firstFail = now
	}
	warn := first || now.Sub(s.lastWarn) >= startWarnEvery
	if warn {
		s.lastWarn = now
	}
	n, since := s.failures, now.Sub(s.firstFail)
	s.mu.Unlock()
	attrs := []any{"op", op, "err", err}
	if retryIn > 0 {
		attrs = append(attrs, "retry_in", retryIn)
	}
	if eps := s.endpoints(); eps != "" {
		attrs = append(attrs, "endpoints", eps)
	}
	if s.startTimeout > 0 {
		attrs = append(attrs, "hint", fmt.Sprintf("check the endpoints and that the store runs; Run fails with ErrStartTimeout if not ready within StartTimeout (%v)", s.startTimeout))
	} else {
		attrs = append(attrs, "hint", "check the endpoints and that the store runs; Run waits without bound (StartTimeout < 0): set Config.StartTimeout > 0 to fail instead")
	}
	switch {
	case first:
		s.log.Warn("cannot start: store call failed; retrying", attrs...)
	case warn:
		s.log.Warn("still cannot start: store calls keep failing; retrying",
			append(attrs, "failed_attempts", n, "for", since.Round(time.Second))...)
	default:
		s.log.Debug("start: store call failed; retrying", append(attrs, "failed_attempts", n)...)
	}
}

// startRefused ends Run when the store refused the runner's credentials
// or permissions (storage.ErrPermissionDenied) during the start: no retry
// can succeed before an operator changes them. It reports whether it did.
func (r *Runner) startRefused(op string, err error) bool {
	if !errors.Is(err, storage.ErrPermissionDenied) {
		return false
	}
	err = fmt.Errorf("runner %s cannot start: %s: %w (%s)", r.cfg.ID, op, err, deniedHint)
	attrs := []any{"err", err}
	if eps := r.st.endpoints(); eps != "" {
		attrs = append(attrs, "endpoints", eps)
	}
	r.met.storageErrors.Add(context.Background(), 1, r.met.attrs, withErrorType(err))
	r.log.Error("the store refused this runner's credentials or permissions; stopping", attrs...)
	r.failRun(err)
	return true
}

// mayReadCluster reports whether a client-only runner that was refused a
// permission checking the cluster record may read it: it was refused the
// write of a record that was missing (or damaged), as a role granting
// only read (enough for a client-only runner) is when it starts before any
// hosting runner published the record. It then tries again instead of
// failing: the record may be there already.
func mayReadCluster(ctx context.Context, store storage.Store, timeout time.Duration) bool {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, _, err := store.ReadCluster(cctx)
	return err == nil || errors.Is(err, storage.ErrCorrupt)
}

// deniedHint says what to check when the store refuses the runner.
const deniedHint = "with etcd: the client's user and password or certificate, and a role granting " +
	"readwrite on the namespace's prefix \"/{namespace}/\"; see SECURITY.md"

// reattachFailed records a failed re-attach of a detached runner: counted
// in sharding.storage_errors and logged at WARN, or, when the store
// refused the runner's credentials or permissions, as refusedWhileDetached
// says. The runner stays detached and tries again after RecoverWindow of
// health.
func (s *startState) reattachFailed(err error) {
	if errors.Is(err, storage.ErrPermissionDenied) {
		s.refusedWhileDetached("re-attach", err)
		return
	}
	s.met.storageErrors.Add(context.Background(), 1, s.met.attrs, withErrorType(err))
	s.log.Warn("re-attach failed", "err", err)
}

// refusedWhileDetached records a call of a detached runner (call: its
// probe, or a re-attach) that the store refused for the runner's
// credentials or permissions: counted in sharding.storage_errors
// (error.type=permission_denied), logged at ERROR — an operator must act —
// the first time and then at most once a minute with the count of
// refusals since the first (DEBUG between). A role that lost read as well
// as write fails the probes, a role that kept read the re-attaches: both
// are loud.
func (s *startState) refusedWhileDetached(call string, err error) {
	s.met.storageErrors.Add(context.Background(), 1, s.met.attrs, withErrorType(err))
	now := time.Now()
	s.mu.Lock()
	s.denied++
	n, first := s.denied, s.deniedLog.IsZero()
	loud := first || now.Sub(s.deniedLog) >= startWarnEvery
	if loud {
		s.deniedLog = now
	}
	s.mu.Unlock()
	const msg = "refused: the store denies this runner's credentials or permissions; staying detached"
	if !loud {
		s.log.Debug(msg, "call", call, "err", err, "refused_calls", n)
		return
	}
	s.log.Error(msg, "call", call, "err", err, "refused_calls", n, "hint", deniedHint)
}

// explainUnavailable returns err, a failed start call, preceded by the
// store's connection error when the call found the store unavailable and
// the store can say why (connectionDiagnoser): "etcd unreachable:
// 10.0.0.1:2379: dial tcp 10.0.0.1:2379: connect: connection refused"
// says more than the call's "context deadline exceeded". The result
// matches both errors.
func explainUnavailable(store storage.Store, opTimeout time.Duration, err error) error {
	d, ok := store.(connectionDiagnoser)
	if !ok || !errors.Is(err, storage.ErrUnavailable) {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(diagnoseTimeout, opTimeout))
	defer cancel()
	cerr := d.ConnectionError(ctx)
	if cerr == nil { // reachable: the call failed for another reason
		return err
	}
	return fmt.Errorf("%w (the call: %w)", cerr, err)
}

// notStarted says why a runner that is not ready is not, once a start
// call failed: "not started: etcd at 10.0.0.1:2379 unreachable since
// 10:04:05 (45s, 9 failed attempts): <the last failure>" (local time).
// It returns "" and nil once the runner is ready, and before any failure.
func (s *startState) notStarted() (string, error) {
	s.mu.Lock()
	n, since, last := s.failures, s.firstFail, s.lastErr
	s.mu.Unlock()
	if n == 0 || last == nil {
		return "", nil
	}
	select {
	case <-s.ready:
		return "", nil
	default:
	}
	what := "the store"
	if eps := s.endpoints(); eps != "" {
		what = "etcd at " + eps
	}
	how := "unreachable"
	if !errors.Is(last, storage.ErrUnavailable) {
		how = "failing"
	}
	attempts := "1 failed attempt"
	if n > 1 {
		attempts = fmt.Sprintf("%d failed attempts", n)
	}
	return fmt.Sprintf("not started: %s %s since %s (%v, %s): %v",
		what, how, since.Format("15:04:05"), time.Since(since).Round(time.Second), attempts, last), last
}

// lastError returns the last start failure while the runner is not ready.
func (s *startState) lastError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}
