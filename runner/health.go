package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/shardhost/shardhost/storage"
)

// Health checks for process supervisors: Kubernetes probes, systemd's
// readiness notification and watchdog. The rules (package doc, "Health
// checks") follow the detach rule: a store that is slow or unreachable
// makes a runner detach, and a detached runner is not ready, but live.

// HealthCheck is the answer of a liveness or readiness check.
type HealthCheck struct {
	// OK: live (CheckLiveness) or ready (CheckReadiness).
	OK bool `json:"ok"`
	// Runner is the runner's ID (Config.ID).
	Runner string `json:"runner"`
	// Phase is the runner's phase, as Status().Phase says it: new,
	// starting, attached, detached, stopping or stopped.
	Phase string `json:"phase"`
	// Reason says why, in words: what the runner is doing, or what it
	// waits for.
	Reason string `json:"reason"`
	// Owned is how many shards a hosting runner owns; Assigned how many
	// the assignment gives it, and AssignedOwned how many of those it
	// owns (readiness waits for all of them).
	Owned         int `json:"owned"`
	Assigned      int `json:"assigned"`
	AssignedOwned int `json:"assigned_owned"`
}

// healthLockWait bounds how long a check waits for the runner's state
// (its mutex): a runner whose state stays locked longer is stuck — a bug
// to restart the process for, which liveness reports. Nothing holds the
// mutex across a store call, so a slow store never makes it wait.
const healthLockWait = 2 * time.Second

// healthState is what a check reads of the runner, copied under r.mu.
type healthState struct {
	life          lifeState
	fatal         error
	assigned      int
	assignedOwned int
	owned         int
	// withSelf: the assignment was computed from a view holding this
	// runner as it is now (registered, with its weight: not draining).
	withSelf bool
	members  int // hosting runners in the view
	// membersErr: the membership view is not current (its watch or
	// listing failed, no listing succeeded since membersErrSince).
	membersErr      error
	membersErrSince time.Time
	// probeErr: a ClientOnly runner's last probe of the store failed
	// (storeProbe), in a streak since probeErrSince.
	probeErr      error
	probeErrSince time.Time
}

// healthReads lets concurrent checks share one read of the runner's state
// while it is in flight: a stuck mutex then holds one goroutine, not one
// per probe.
type healthReads struct {
	mu  sync.Mutex
	cur *healthRead
}

type healthRead struct {
	done chan struct{} // closed once st is set
	st   healthState
}

// readHealth copies the runner's state for a check, waiting at most
// healthLockWait for its mutex; ok is false when it did not get it. The
// goroutine that reads it is waited for by the checks of its result; it
// outlives them only while the mutex stays locked.
func (r *Runner) readHealth() (st healthState, ok bool) {
	h := &r.healthReads
	h.mu.Lock()
	rd := h.cur
	if rd == nil {
		rd = &healthRead{done: make(chan struct{})}
		h.cur = rd
		go func() {
			rd.st = r.healthStateLocked()
			h.mu.Lock()
			h.cur = nil
			h.mu.Unlock()
			close(rd.done)
		}()
	}
	h.mu.Unlock()
	t := time.NewTimer(healthLockWait)
	defer t.Stop()
	select {
	case <-rd.done:
		return rd.st, true
	case <-t.C:
		return healthState{}, false
	}
}

// healthStateLocked takes r.mu and copies what the checks read.
func (r *Runner) healthStateLocked() healthState {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := healthState{
		life: r.lifecycle, fatal: r.fatal, owned: r.shards.owned,
		members: len(r.view.members), membersErr: r.view.membersErr, membersErrSince: r.view.membersErrSince,
	}
	r.storeProbe.mu.Lock()
	st.probeErr, st.probeErrSince = r.storeProbe.err, r.storeProbe.since
	r.storeProbe.mu.Unlock()
	if r.view.assignedWithSelf && !r.opDrain.requested.Load() {
		for _, m := range r.view.assignedFrom {
			st.withSelf = st.withSelf || (m.ID == r.cfg.ID && m.Weight == r.cfg.Weight)
		}
	}
	for _, id := range r.view.assignment.All() {
		if id == r.cfg.ID {
			st.assigned++
		}
	}
	for s := range r.shards.ownedShards() {
		if r.assignedHereLocked(s.id) {
			st.assignedOwned++
		}
	}
	return st
}

// storeProbe is what a ClientOnly runner's probes of the store found
// (storeProbe.run): a gateway holds no lease, so nothing else tells it that
// its watches stalled on an unreachable store (they do so without an
// error).
type storeProbe struct {
	mu     sync.Mutex
	probed bool      // a probe has completed
	err    error     // the last probe's failure; nil: it succeeded
	since  time.Time // when the streak of failures began
}

// run reads store's cluster record every interval (each read bounded by
// opTimeout) until ctx ends or stop is closed (Shutdown), and keeps the
// outcome for CheckReadiness. The cluster record, not Ping's key: a
// gateway's role grants read on the record and the keyspaces it watches
// only (SECURITY.md); etcd serves the read linearizably, so it fails
// without a leader too.
func (p *storeProbe) run(ctx context.Context, stop <-chan struct{}, store storage.Store, opTimeout, interval time.Duration) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, opTimeout)
		_, _, err := store.ReadCluster(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		if err != nil && p.err == nil {
			p.since = time.Now()
		}
		p.probed, p.err = true, err
		p.mu.Unlock()
		t.Reset(interval)
	}
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// CheckLiveness reports whether the runner's loops run: false once Run has
// returned other than by Shutdown (a fatal error such as
// ErrDuplicateRunnerID or ErrStartTimeout, Close, the end of Run's
// context), and when the runner's state stayed locked for 2 s (a stuck
// runner). It reads memory only: a slow or unreachable store never makes
// it fail — the runner detaches instead, and re-attaches by itself. It
// is live before Run, while starting (waiting for the store, or for a
// crashed predecessor's lease to expire: Config.ID) and while detached.
func (r *Runner) CheckLiveness() HealthCheck {
	c, st, shutdown, ok := r.beginCheck()
	if !ok {
		return c
	}
	c.Assigned, c.AssignedOwned = 0, 0
	switch {
	case st.fatal != nil:
	case (closed(r.sig.done) || st.life.phase == phaseClosed) && !shutdown:
		c.Reason = "stopped: Run returned (Close, or its context ended)"
	default:
		c.OK = true
	}
	return c
}

// CheckReadiness reports whether the runner serves its part of the
// cluster. A hosting runner is ready while it is attached and owns every
// shard the assignment (computed with it as a member) gives it; a
// ClientOnly runner once it has checked the cluster record and listed the
// runners, while its membership view is current and at least one
// hosting runner is registered. Current: its last probe of the store (a
// linearizable read of the cluster record every ProbeInterval, bounded by
// OpTimeout; a watch cut off from the store stalls without an error)
// succeeded, and the runners' watch has not failed since the last good
// listing. Neither is
// ready before Run, while starting, detached, draining (Shutdown's
// handoff step, or an operator's drain request) or stopping: a Shutdown
// makes it not ready at once. It reads memory only.
func (r *Runner) CheckReadiness() HealthCheck {
	c, st, shutdown, ok := r.beginCheck()
	if !ok {
		return c
	}
	switch {
	case st.fatal != nil, shutdown, closed(r.sig.done), !st.life.ran():
	case r.cfg.ClientOnly:
		switch {
		case !closed(r.st.ready):
		case st.probeErr != nil:
			c.Reason = fmt.Sprintf("store unreachable for %v (%v): the membership view may be stale",
				time.Since(st.probeErrSince).Round(time.Millisecond), st.probeErr)
		case st.membersErr != nil:
			c.Reason = fmt.Sprintf("membership view not current: the runners' watch failed %v ago (%v); listing again",
				time.Since(st.membersErrSince).Round(time.Millisecond), st.membersErr)
		case st.members == 0:
			c.Reason = "no hosting runner registered: asks would wait for one"
		default:
			c.OK = true
			c.Reason = fmt.Sprintf("routing to %d runners", st.members)
		}
	case st.life.phase != phaseAttached || st.life.draining:
	case r.opDrain.requested.Load():
		c.Reason = "drained: an operator's drain request (shardhostctl undrain " + r.cfg.ID + " withdraws it)"
	case !st.withSelf:
		c.Reason = "attached: waiting for an assignment computed with this runner"
	case st.assignedOwned < st.assigned:
		c.Reason = fmt.Sprintf("attached: taking its shards, %d of the %d assigned to it owned", st.assignedOwned, st.assigned)
	default:
		c.OK = true
		c.Reason = fmt.Sprintf("attached: owns the %d shards assigned to it", st.assigned)
		if extra := st.owned - st.assignedOwned; extra > 0 {
			c.Reason += fmt.Sprintf(" (and %d leaving)", extra)
		}
	}
	return c
}

// beginCheck reads the runner's state for either check and fills in what
// both answer: the phase, the counts and what the runner is doing; ok is
// false (and c says stuck) when its state stayed locked.
func (r *Runner) beginCheck() (c HealthCheck, st healthState, shutdown, ok bool) {
	c = HealthCheck{Runner: r.cfg.ID}
	if st, ok = r.readHealth(); !ok {
		c.Phase = "unknown"
		c.Reason = fmt.Sprintf("stuck: the runner's state has been locked for over %v", healthLockWait)
		return c, st, false, false
	}
	c.Phase, c.Owned, c.Assigned, c.AssignedOwned = st.life.phase.String(), st.owned, st.assigned, st.assignedOwned
	shutdown = closed(r.sig.stopReq)
	c.Reason = r.phaseReason(st, shutdown)
	return c, st, shutdown, true
}

// phaseReason says what the runner is doing, for either check.
func (r *Runner) phaseReason(st healthState, shutdown bool) string {
	switch {
	case st.fatal != nil:
		return "stopped: " + st.fatal.Error()
	case st.life.phase == phaseClosed:
		return "stopped before Run"
	case closed(r.sig.done):
		if shutdown {
			return "stopped by Shutdown"
		}
		return "stopped"
	case shutdown:
		return "stopping: Shutdown hands its shards off"
	}
	switch st.life.phase {
	case phaseNew:
		return "not started: Run not called"
	case phaseStarting:
		if r.cfg.ClientOnly && closed(r.st.ready) {
			return fmt.Sprintf("routing to %d runners", st.members)
		}
		if note, _ := r.st.notStarted(); note != "" {
			return "starting: " + note
		}
		if r.cfg.ClientOnly {
			return "starting: checking the cluster record and listing the runners"
		}
		return "starting: registering (after a crash, once the previous process's lease expired)"
	case phaseDetached:
		d := r.wd.machine.State()
		return fmt.Sprintf("detached (%s) since %s: owns nothing, probes the store and re-attaches after RecoverWindow of health",
			d.Reason, d.Since.Format(time.RFC3339))
	case phaseAttached:
		if st.life.draining {
			return "draining: Shutdown hands its shards off"
		}
		return fmt.Sprintf("attached: owns %d shards", st.owned)
	}
	return st.life.phase.String()
}

// LivenessHandler returns an http.Handler answering CheckLiveness: 200
// when live, 503 when not, with the HealthCheck as a JSON body. Mount it
// beside the debug page, e.g. mux.Handle("/livez", r.LivenessHandler()),
// as the liveness probe of a Kubernetes pod or the check behind a
// watchdog. It answers GET and HEAD (405 otherwise) and changes nothing.
func (r *Runner) LivenessHandler() http.Handler { return healthHandler(r.CheckLiveness) }

// ReadinessHandler returns an http.Handler answering CheckReadiness: 200
// when ready, 503 when not, with the HealthCheck as a JSON body. Mount it
// beside the debug page, e.g. mux.Handle("/readyz", r.ReadinessHandler()),
// as the readiness probe of a Kubernetes pod. It answers GET and HEAD
// (405 otherwise) and changes nothing.
func (r *Runner) ReadinessHandler() http.Handler { return healthHandler(r.CheckReadiness) }

func healthHandler(check func() HealthCheck) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		c := check()
		body, err := json.Marshal(c)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		code := http.StatusOK
		if !c.OK {
			code = http.StatusServiceUnavailable
		}
		w.WriteHeader(code)
		if req.Method == http.MethodGet {
			_, _ = w.Write(append(body, '\n'))
		}
	})
}
