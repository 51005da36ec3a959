package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/sharding"
)

// Params are the harness's knobs (the command's flags).
type Params struct {
	Runners  int           // hosting runners at the start; the count wanders in [2, Runners+2]
	Shards   int           // NumShards
	TTL      time.Duration // LeaseTTL
	Callers  int           // goroutines sending asks through the gateway
	Entities int           // counters the callers address
	Duration time.Duration // load and churn
	Steps    int           // stop after this many steps, even before Duration has passed (0: no limit)
	Every    time.Duration // between churn steps (at least: a step waits for the previous one to settle)
	Crash    bool          // include crash steps
	Seed     uint64        // picks the runner a shutdown or crash step stops
	Etcd     string        // host:port of an existing etcd; "" starts ./bin/etcd
	Verbose  bool          // runners' info logs and the etcd client's warnings
	Steady   time.Duration // after the cold start, measure the settled cluster this long (0: skip)
	// StatePoll: after the cold start, poll the runners' Status this often
	// until every owned shard's state is read (0: do not wait for it).
	StatePoll time.Duration
	Procs     bool // hosting runners in separate OS processes (crash = SIGKILL)
	// InProcessLoad runs the gateway and the callers in the harness's
	// process, their CPU counted with the runners' (else in a child of
	// their own).
	InProcessLoad bool
	StartRate     float64       // the first runners start at this many a second (0: all at once)
	StartTimeout  time.Duration // runners' StartTimeout (0: the runner's default; negative: wait forever)
	ColdTimeout   time.Duration // how long the cold start may take (0: settleTimeout)
	Progress      time.Duration // a cold-start progress sample every this long (0: none)
	// Burst, if positive, makes every step a burst, joins and leaves
	// alternately (joins first): Burst runners start within one second, or
	// Burst runners, at random, shut down gracefully within one second.
	Burst int
}

// churnProfile, if not nil, receives a CPU profile of the churn phase:
// its steps and the load between them, not the cold start (-churnprofile).
var churnProfile io.Writer

// coldProfile, if not nil, receives a CPU profile of the cold start alone:
// from the first runner's start until every shard is owned or the cold
// start is given up (-coldprofile).
var coldProfile io.Writer

// Bounds on waiting.
const (
	askTimeout    = 10 * time.Second
	settleTimeout = 60 * time.Second // a crash settles after about a TTL; a stuck handoff waits HandoffWait (15 s)
	stopTimeout   = 30 * time.Second // one runner's Shutdown
	settlePoll    = 5 * time.Millisecond
)

// The entity: an in-memory counter.
type counter struct{ n int64 }

type incReq struct{}

func (c *counter) Inc(context.Context, incReq) (int64, error) { c.n++; return c.n, nil }

var (
	counterKind = entity.NewKind("counter", func(string) *counter { return &counter{} })
	incMethod   = entity.Method(counterKind, "inc", (*counter).Inc)
)

// Step kinds.
const (
	stepAdd      = "add"
	stepShutdown = "shutdown"
	stepCrash    = "crash"
)

var stepKinds = []string{stepAdd, stepShutdown, stepCrash}

// Burst step kinds (-burst).
const (
	stepBurstJoin  = "burst-join"
	stepBurstLeave = "burst-leave"
)

var burstKinds = []string{stepBurstJoin, stepBurstLeave}

// burstSpread is the time over which a burst's runners start or stop.
const burstSpread = time.Second

// step is one churn step.
type step struct {
	Kind    string
	Runner  string
	start   time.Time     // the step began (the crash instant for a crash)
	settled time.Time     // zero if it did not settle within settleTimeout
	After   int           // hosting runners after the step
	spread  time.Duration // a burst: its first start (stop) to its last
	cost    StepCost      // from its start to its settle
}

// askRec is one ask: when it started (since the load began), how long it
// took and how it ended (0: success, else 1 + the index of its class).
type askRec struct {
	at, dur time.Duration
	class   int8
}

// harness is one run.
type harness struct {
	p    Params
	etcd *etcdServer
	log  *slog.Logger
	logs io.Writer // progress: the runners' logs and the load child's
	say  func(format string, args ...any)
	rng  *rand.Rand
	rec  recorder

	load  loadDriver // the gateway, its callers and the crash probes
	live  []*node    // hosting runners up now (churn goroutine only, after start)
	nodes []*node    // every node started, for the final cleanup
	ids   int        // hosting runners started: the next one is r<ids+1>
	downs int        // shutdown and crash steps so far

	steps     []step
	crashes   map[string]time.Time // crashed runner -> crash instant
	problems  []string
	coldStart time.Duration // the first runners started -> every shard owned
	// Where the cold start went: the first runners started -> the last of
	// them registered (-procs: not followed, 0), what it cost, and its
	// progress samples.
	coldRegistered time.Duration
	// coldLoaded: the first runners started -> no owned shard's state
	// (reminders, remembered entities) left to read (0: not followed);
	// coldLoadedCost: what the cold start cost until then.
	coldLoaded     time.Duration
	coldLoadedCost StepCost
	coldCost       StepCost
	coldProgress   []ColdSample
	coldDone       bool // every shard owned (else the run stopped after the cold start)
	steady         SteadyReport
	between        BetweenSteps // the load between steps
	firstAsks      []firstAsk   // crash steps: each lost shard's first answer
	pollCPU        atomic.Int64 // CPU time of the settle polls (pollThread), in ns
	lastPoll       atomic.Int64 // how long the last settle poll took, in ns
}

// run performs a whole run on an etcd it opens (and closes) and returns
// the report. progress receives one line per step as it happens.
func run(ctx context.Context, p Params, progress io.Writer) (*Report, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	began := time.Now()
	progress = &syncWriter{w: progress} // the runners' logs, the load child's and ours
	say := func(format string, args ...any) {
		fmt.Fprintf(progress, "[%5.1fs] "+format+"\n", append([]any{time.Since(began).Seconds()}, args...)...)
	}
	fdLimit := raiseFDLimit() // before etcd starts: it inherits the limit
	e, err := openEtcd(ctx, p.Etcd)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	say("etcd at %s (%s), namespace %q; open files limit %d", e.Endpoint, e.Source, e.Namespace, fdLimit)
	level := slog.LevelError
	if p.Verbose {
		level = slog.LevelInfo
	}
	h := &harness{
		p: p, etcd: e, say: say, logs: progress,
		log:     slog.New(slog.NewTextHandler(progress, &slog.HandlerOptions{Level: level})),
		rng:     rand.New(rand.NewPCG(p.Seed, p.Seed^0x9e3779b97f4a7c15)),
		crashes: map[string]time.Time{},
	}
	defer h.cleanup()
	return h.run(ctx)
}

func (p Params) validate() error {
	switch {
	case p.Runners < 2:
		return fmt.Errorf("-runners %d: want at least 2", p.Runners)
	case p.Callers < 0 || p.Entities < 1:
		return errors.New("-callers must not be negative and -entities must be positive")
	case p.Duration <= 0 || p.Every <= 0:
		return errors.New("-duration and -every must be positive")
	case p.ColdTimeout < 0 || p.Progress < 0 || p.StartRate < 0:
		return errors.New("-coldtimeout, -progress and -startrate must not be negative")
	case p.Steps < 0:
		return fmt.Errorf("-steps %d: want 0 (no limit) or more", p.Steps)
	case p.Burst < 0 || p.Burst > 0 && p.Runners-p.Burst < 2:
		return fmt.Errorf("-burst %d: want 0 (no bursts) or at most -runners - 2 (%d) so that a leave burst leaves 2 runners", p.Burst, p.Runners-2)
	case p.Shards < p.Runners+max(2, p.Burst):
		return fmt.Errorf("-shards %d: want at least -runners + -burst (%d) so that every runner owns a shard", p.Shards, p.Runners+p.Burst)
	case p.Shards < p.Runners+2:
		return fmt.Errorf("-shards %d: want at least -runners + 2 (%d) so that every runner owns a shard", p.Shards, p.Runners+2)
	}
	return nil
}

func (h *harness) run(ctx context.Context) (*Report, error) {
	var err error
	if h.load, err = h.startLoad(); err != nil {
		return nil, err
	}
	if coldProfile != nil {
		if err := pprof.StartCPUProfile(coldProfile); err != nil {
			h.problem("cold start profile: %v", err)
			coldProfile = nil
		}
	}
	// The first runners start together, as a deployment's pods do (or
	// StartRate a second).
	start := time.Now()
	c0 := h.markCost(ctx)
	cold := h.watchCold(start, c0)
	if h.live, err = h.startNodes(h.p.Runners); err != nil {
		cold.finish(true)
		return nil, err
	}
	cold.setNodes(h.live)
	coldTimeout := cmp.Or(h.p.ColdTimeout, settleTimeout)
	h.coldDone = h.waitSettled(ctx, coldTimeout-time.Since(start)) // -startrate: the wait counts from the first start
	h.coldProgress = cold.finish(h.coldDone)
	if coldProfile != nil {
		pprof.StopCPUProfile()
	}
	h.coldStart = time.Since(start)
	h.coldCost = h.costSince(ctx, c0, len(h.live))
	h.coldRegistered = h.rec.lastRegistered(start, start.Add(h.coldStart))
	if !h.coldDone {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		// Report how far it got: the run ends here.
		h.problem("the first %d runners did not settle within %v (cold start): %s", h.p.Runners, coldTimeout, h.ownership())
		h.stopAll(true)
		end := time.Now()
		rep := h.analyze(start, end, start, nil, nil)
		rep.timeline = h.timeline(start, end, start, nil)
		return rep, nil
	}
	h.say("%d runners own all %d shards %v after they started", len(h.live), h.p.Shards, round(h.coldStart))
	h.say("cold start: the last runner registered after %v; CPU: runners %.1f s, etcd %.1f s, gateway %.1f s (over %v of wall time on %d cores); etcd sent %.0f watch events, handled %.0f requests",
		round(h.coldRegistered), h.coldCost.RunnersCPU, h.coldCost.EtcdCPU, h.coldCost.LoadCPU, round(h.coldStart), runtime.NumCPU(), h.coldCost.WatchEvents, h.coldCost.Requests)
	if h.waitStateLoaded(ctx, coldTimeout-time.Since(start)) {
		h.coldLoaded = time.Since(start)
		h.coldLoadedCost = h.costSince(ctx, c0, len(h.live))
		h.say("every owned shard's reminders and remembered entities read %v after the start; etcd handled %.0f requests until then",
			round(h.coldLoaded), h.coldLoadedCost.Requests)
	}
	if h.p.Steady > 0 {
		h.rec.quiet(500*time.Millisecond, 10*time.Second)
		if h.steady, err = h.measureSteady(ctx, h.p.Steady, len(h.live)); err != nil {
			return nil, err
		}
		h.say("steady for %v, no load: %.2f%% of a core per runner, etcd %.1f puts/s, %.1f deletes/s, %.1f proposals/s, %.1f requests/s",
			h.p.Steady, h.steady.RunnerCPUPercent, h.steady.PutsPerSec, h.steady.DeletesPerSec, h.steady.ProposalsPerSec, h.steady.RequestsPerSec)
	}
	limit := ""
	if h.p.Steps > 0 {
		limit = fmt.Sprintf(" (at most %d steps)", h.p.Steps)
	}
	h.say("load: %d callers -> %d counters; churn for %v%s, a step every %v",
		h.p.Callers, h.p.Entities, h.p.Duration, limit, h.p.Every)

	loadBegan, err := h.load.begin()
	if err != nil {
		return nil, fmt.Errorf("start the callers: %w", err)
	}
	churnStart := time.Now()
	h.churn(ctx, churnStart)
	asks, samples, err := h.load.finish()
	end := time.Now()
	interrupted := ctx.Err() != nil
	h.stopAll(interrupted)
	if interrupted {
		return nil, context.Cause(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("the callers' asks: %w", err)
	}
	h.rec.quiet(300*time.Millisecond, 5*time.Second)
	rep := h.analyze(churnStart, end, loadBegan, asks, samples)
	rep.timeline = h.timeline(churnStart, end, loadBegan, asks)
	return rep, nil
}

// startLoad starts the gateway (its callers begin later), in the load
// child unless InProcessLoad.
func (h *harness) startLoad() (loadDriver, error) {
	spec := loadSpec{
		Endpoint: h.etcd.Endpoint, Namespace: h.etcd.Namespace, Shards: h.p.Shards,
		Callers: h.p.Callers, Entities: h.p.Entities, Procs: h.p.Procs, Verbose: h.p.Verbose,
	}
	if h.p.InProcessLoad {
		return newGatewayLoad(spec, h.log)
	}
	return startLoadChild(spec, h.logs)
}

// syncWriter serializes the writes of several goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (w *syncWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(b)
}

// churn performs steps until the duration has passed (or Steps steps are
// done). A step starts Every after the previous one started, but not
// before that one settled, so every step's settle time and window are its
// own.
func (h *harness) churn(ctx context.Context, churnStart time.Time) {
	if churnProfile != nil {
		if err := pprof.StartCPUProfile(churnProfile); err != nil {
			h.problem("churn profile: %v", err)
		} else {
			defer pprof.StopCPUProfile()
		}
	}
	end := churnStart.Add(h.p.Duration)
	next := churnStart.Add(h.p.Every)
	// The load between steps (from a settle, or the churn's start, to the
	// next step) is measured too: what the runners spend serving the
	// callers with no change under way.
	idle, idleAt := h.markCost(ctx), time.Now()
	defer func() {
		if ctx.Err() == nil {
			h.between.add(h.costSince(ctx, idle, len(h.live)), time.Since(idleAt))
		}
	}()
	for next.Before(end) {
		if h.p.Steps > 0 && len(h.steps) == h.p.Steps {
			// Leave Every of load after the last step, as between steps.
			sleepUntil(ctx, next)
			return
		}
		if !sleepUntil(ctx, next) {
			return
		}
		kind := h.pick()
		c0 := h.markCost(ctx)
		h.between.add(h.costSince(ctx, idle, len(h.live)), time.Since(idleAt))
		s := h.doStep(ctx, kind)
		s.cost = h.costSince(ctx, c0, s.After)
		wins, _ := cutovers(h.rec.all(), h.crashes, func(t time.Time) bool { return !t.Before(s.start) })
		s.cost.setMoved(len(wins)) // the report counts again with every event in
		if ctx.Err() != nil {
			return
		}
		h.steps = append(h.steps, s)
		if s.settled.IsZero() {
			h.problem("step %d (%s %s) did not settle within %v: %s", len(h.steps), s.Kind, s.Runner, settleTimeout, h.ownership())
			return // the cluster is in an unknown state: measuring on is meaningless
		}
		spread := ""
		if s.spread > 0 {
			spread = fmt.Sprintf(" (spread over %v)", round(s.spread))
		}
		h.say("step %2d: %-8s %-3s%s -> %d runners, settled in %v (%s)",
			len(h.steps), s.Kind, s.Runner, spread, s.After, round(s.settled.Sub(s.start)), s.cost.summary(h.p))
		next = s.start.Add(h.p.Every)
		if s.settled.After(next) {
			next = s.settled
		}
		idle, idleAt = h.markCost(ctx), time.Now()
	}
	sleepUntil(ctx, end)
}

// pick chooses the next step: up (add) or down with even odds, up at 2
// runners and down at Runners+2; downs alternate graceful shutdown and
// crash (crash only with -crash). The runner count thus does a random walk
// between 2 and Runners+2.
func (h *harness) pick() string {
	if h.p.Burst > 0 {
		if len(h.steps)%2 == 0 {
			return stepBurstJoin
		}
		return stepBurstLeave
	}
	n := len(h.live)
	up := h.rng.IntN(2) == 0
	switch {
	case n <= 2:
		up = true
	case n >= h.p.Runners+2:
		up = false
	}
	if up {
		return stepAdd
	}
	h.downs++
	if h.p.Crash && h.downs%2 == 0 {
		return stepCrash
	}
	return stepShutdown
}

// doStep performs one step and waits for the cluster to settle.
func (h *harness) doStep(ctx context.Context, kind string) step {
	s := step{Kind: kind, start: time.Now()}
	var (
		stopping *node      // the runner a shutdown step stops
		stopped  chan error // its Shutdown's result (a burst's: each one's)
		leaving  []*node    // the runners a burst-leave step stops
		probing  = -1       // a crash step's probers, as the load numbers them (-1: none)
	)
	switch kind {
	case stepAdd:
		n, err := h.startNode()
		if err != nil {
			h.problem("add: %v", err)
			return s
		}
		h.live = append(h.live, n)
		s.Runner = n.id
	case stepShutdown, stepCrash:
		i := h.rng.IntN(len(h.live))
		n := h.live[i]
		h.live = slices.Delete(h.live, i, i+1)
		s.Runner = n.id
		if kind == stepCrash {
			owned, _ := n.view(&h.rec)
			s.start = time.Now()
			h.crashes[n.id] = s.start
			n.crash(&h.rec, s.start) // no release, no revoke: the lease expires after the TTL
			if id, err := h.load.probe(slices.Sorted(maps.Keys(owned)), n.id, s.start); err != nil {
				h.problem("crash probes: %v", err)
			} else {
				probing = id
			}
			break
		}
		stopping, stopped = n, make(chan error, 1)
		go func() { stopped <- h.stopNode(n) }()
	case stepBurstJoin:
		s.Runner, s.spread = h.burstJoin(ctx, s.start)
	case stepBurstLeave:
		leaving, stopped = h.burstLeave(ctx, s.start)
		s.Runner, s.spread = leaving[0].id+".."+leaving[len(leaving)-1].id, time.Since(s.start)
	}
	s.After = len(h.live)
	if h.waitSettled(ctx, settleTimeout) {
		s.settled = time.Now()
	}
	if probing >= 0 {
		res, err := h.load.probed(probing)
		if err != nil {
			h.problem("crash probes: %v", err)
		}
		h.firstAsks = append(h.firstAsks, res...)
	}
	for range leaving {
		if err := <-stopped; err != nil && ctx.Err() == nil {
			h.problem("shutdown in a burst: %v", err)
		}
	}
	if stopping != nil {
		if ctx.Err() != nil {
			stopping.crash(&h.rec, time.Now()) // interrupted: do not wait for the handoffs
		}
		if err := <-stopped; err != nil && ctx.Err() == nil {
			h.problem("shutdown of %s: %v", s.Runner, err)
		}
	}
	return s
}

// burstJoin starts Burst runners, evenly over burstSpread from start, and
// returns their names and the time from start to the last one started.
func (h *harness) burstJoin(ctx context.Context, start time.Time) (string, time.Duration) {
	var first, last string
	for i := range h.p.Burst {
		if !sleepUntil(ctx, start.Add(burstSpread*time.Duration(i)/time.Duration(h.p.Burst))) {
			break
		}
		n, err := h.startNode()
		if err != nil {
			h.problem("burst join: %v", err)
			continue
		}
		h.live = append(h.live, n)
		if first == "" {
			first = n.id
		}
		last = n.id
	}
	return first + ".." + last, time.Since(start)
}

// burstLeave removes Burst random runners from the live ones and shuts
// them down gracefully, evenly over burstSpread from start (it returns once
// the last shutdown began); stopped receives each Shutdown's result.
func (h *harness) burstLeave(ctx context.Context, start time.Time) (leaving []*node, stopped chan error) {
	stopped = make(chan error, h.p.Burst)
	for range h.p.Burst {
		i := h.rng.IntN(len(h.live))
		leaving = append(leaving, h.live[i])
		h.live = slices.Delete(h.live, i, i+1)
	}
	for i, n := range leaving {
		sleepUntil(ctx, start.Add(burstSpread*time.Duration(i)/time.Duration(h.p.Burst)))
		go func() { stopped <- h.stopNode(n) }()
	}
	return leaving, stopped
}

// waitSettled polls until the live runners own every shard exactly once,
// each exactly the shards of the assignment they all computed over the
// live runners. It reports false on timeout or when ctx ends.
//
// Each poll runs on an OS thread of its own (pollThread), whose CPU time
// counts as the harness's, not the runners'; polls are settlePoll apart,
// or more so that they take at most a tenth of a core.
func (h *harness) waitSettled(ctx context.Context, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		var ok bool
		t0 := time.Now()
		cpu := pollThread(&h.pollCPU, func() { ok = h.settled() })
		h.lastPoll.Store(int64(time.Since(t0)))
		if ok {
			break
		}
		if time.Now().After(deadline) {
			return false
		}
		// At most a tenth of a core polling: a poll of many runners costs
		// CPU (and takes long, waiting for each runner's lock, which
		// costs none).
		select {
		case <-ctx.Done():
			return false
		case <-time.After(max(settlePoll, 9*cpu)):
		}
	}
	return true
}

// waitStateLoaded waits, up to timeout, until no runner has an owned
// shard whose reminders and remembered entities are still to be read
// (Status.ShardsLoading), polling every StatePoll, and reports whether
// that came. With -procs or StatePoll 0 it is not followed: false at once.
func (h *harness) waitStateLoaded(ctx context.Context, timeout time.Duration) bool {
	if h.p.Procs || h.p.StatePoll <= 0 {
		return false
	}
	deadline := time.Now().Add(timeout)
	for {
		loading := 0
		for _, n := range h.live {
			loading += n.r.Status().ShardsLoading
		}
		if loading == 0 {
			return true
		}
		if time.Now().After(deadline) || !sleepUntil(ctx, time.Now().Add(h.p.StatePoll)) {
			h.problem("%d owned shards' state still not read %v after the cold start", loading, timeout)
			return false
		}
	}
}

// settled reports whether the live runners agree on the assignment (equal
// digests; with -procs, the assignment the harness computes for them) and
// own exactly its shards.
func (h *harness) settled() bool {
	live, numShards := h.live, h.p.Shards
	if !h.p.Procs {
		// First the runners' counts: listing every runner's shards at
		// every poll would cost the measured step O(runners x shards)
		// per poll (and each runner's lock).
		var digest uint64
		total := 0
		for i, n := range live {
			st := n.r.Status()
			if st.AssignmentDigest == 0 || (i > 0 && st.AssignmentDigest != digest) {
				return false
			}
			digest = st.AssignmentDigest
			total += st.Owned
		}
		if total != numShards {
			return false
		}
	}
	views := make([]map[sharding.ShardID]bool, len(live))
	var digest uint64
	for i, n := range live {
		owned, d := n.view(&h.rec)
		if d == 0 || (i > 0 && d != digest) {
			return false
		}
		views[i], digest = owned, d
	}
	var a sharding.Assignment
	if h.p.Procs {
		var err error
		if a, err = expectedAssignment(live, numShards); err != nil || a.Digest() != digest {
			return false
		}
	} else {
		a = live[0].r.Assignment() // all agree: one copy is enough
	}
	if len(a) != numShards {
		return false
	}
	counts := a.Counts()
	if len(counts) != len(live) {
		return false
	}
	owned := make([]bool, numShards)
	total := 0
	for i, n := range live {
		if counts[n.id] == 0 {
			return false
		}
		for id := range views[i] {
			if owned[id] || a[id] != n.id {
				return false
			}
			owned[id] = true
			total++
		}
	}
	return total == numShards
}

// ownership reads "r1 64, r2 64 shards owned; 2 assignments (r1 r2 | r3)"
// for error messages.
func (h *harness) ownership() string {
	s := ""
	byDigest := map[uint64][]string{}
	owners := make(map[int][]string)
	const listed = 20 // runners named with their counts; the rest summed up
	none := 0
	for i, n := range h.live {
		owned, digest := n.view(&h.rec)
		switch {
		case i < listed:
			s += fmt.Sprintf("%s %d, ", n.id, len(owned))
		case len(owned) == 0:
			none++
		}
		phase := "process"
		if n.r != nil {
			phase = n.r.Status().Phase
		}
		byDigest[digest] = append(byDigest[digest], fmt.Sprintf("%s(%s)", n.id, phase))
		for id := range owned {
			owners[int(id)] = append(owners[int(id)], n.id)
		}
	}
	if len(h.live) > listed {
		s += fmt.Sprintf("(%d more runners, %d of them owning none), ", len(h.live)-listed, none)
	}
	if len(h.live) > 0 {
		var a sharding.Assignment
		if h.p.Procs {
			a, _ = expectedAssignment(h.live, h.p.Shards)
		} else {
			a = h.live[0].r.Assignment()
		}
		var unowned, misplaced []int
		for id := range len(a) {
			switch o := owners[id]; {
			case len(o) == 0:
				unowned = append(unowned, id)
			case len(o) > 1 || o[0] != a[id]:
				misplaced = append(misplaced, id)
			}
		}
		s += fmt.Sprintf("%d unowned %v, %d not (only) on their assignee %v; ",
			len(unowned), unowned[:min(len(unowned), 5)], len(misplaced), misplaced[:min(len(misplaced), 5)])
		for _, id := range misplaced[:min(len(misplaced), 3)] {
			s += fmt.Sprintf("shard %d assigned to %s owned by %v; ", id, a[id], owners[id])
		}
	}
	s += fmt.Sprintf("shards owned; %d distinct assignments:", len(byDigest))
	for d, ids := range byDigest {
		s += fmt.Sprintf(" [%x: %d runners, e.g. %v]", d, len(ids), ids[:min(len(ids), 4)])
	}
	return s
}

func (h *harness) problem(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	h.problems = append(h.problems, msg)
	h.say("PROBLEM: %s", msg)
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
