package runner_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/runner/runnertest/linearize"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
	"github.com/shardhost/shardhost/transport"
)

// The deterministic cluster simulation: whole clusters of runners on the
// in-memory store and transport, inside testing/synctest (virtual time, no
// socket), under seeded random schedules of faults, with the invariants of
// the fault suite checked on every run:
//
//   - a handler's result is never acknowledged if, while it ran, a newer
//     owner of its shard (a later epoch) ran handlers of the shard (a
//     frozen or cut-off owner's late result);
//   - handlers that respect their context never run on two runners for one
//     shard at once;
//   - every ownership of a shard has its own epoch, and a runner's epochs
//     of a shard increase;
//   - a counter never goes backwards between two acknowledged increments
//     unless an unplanned loss (crash, lost lease, lost lock) came between
//     (planned moves checkpoint on release and restore on activation);
//   - after the last fault heals, the cluster converges: every shard owned
//     exactly once by its assignee, within 2 x TTL + HandoffWait;
//   - every register's history is linearizable (simulation_linearize_test.go,
//     runner/runnertest/linearize).
//
// The schedule (what fault, when, for how long, and every ask's timing)
// is a pure function of the seed and is printed with a failure, with the
// command that replays it (simReplay: the test flags after the package). Virtual time makes the run reproducible in time; the order in
// which goroutines interleave within one instant is the Go scheduler's and
// is not controlled, so a replay reruns the same schedule, not necessarily
// the same interleaving.
var (
	simSeeds = flag.Int("sim.seeds", 0, "simulation seeds to run (default 200, 100 with -short, 50 under -race; make test runs 50 with -race, then 1150 more without)")
	simSeed  = flag.Uint64("sim.seed", 0, "run only this seed")
	simFirst = flag.Uint64("sim.first", 1, "first seed")
	simLog   = flag.Bool("sim.log", false, "print each run's schedule and the runners' logs")
)

// simRegressionSeeds are seeds that once failed, each for a bug fixed
// since: every run of a range that starts at the first seed (the default
// run, make test's race step, make simulate) runs those beyond its range
// too, so each keeps being checked however far from 1 it was found.
var simRegressionSeeds = []uint64{
	30, 581, 3550, // a shard's reminders never fired again after late state writes: a resumed set left a loaded final progress unrewritten, a store call listed a shard twice, the back-off grew on early wake-ups
	19434,  // a periodic reminder judged before its entity was free (a tick waits in the mailbox behind a stubborn handler)
	880373, // a shard's reminders stayed silent after late state writes stopped: the rewrite of its final progress waited a back-off grown to 5 s
	654378, // a takeover started on a stale view of a lock already released (told to another assignee) never re-read it: only a later decision armed the re-read, and none came
	750746, // a renewal landed as a handler saw the detach instant pass: its instance was discarded, the runner kept the shard at the same epoch without detaching (rare: goroutine order)
	550748, // a takeover's re-check installed a rewritten lock while the round deleted the older one as an orphan: the stale releasing mark broke an invariant (rare: goroutine order)
}

// simReplay is the command that replays seed with its log, as printed
// with a failure.
func simReplay(seed uint64) string {
	return fmt.Sprintf("go test -count=1 -run '^TestSimulation$' ./runner/ -sim.seed=%d -sim.log", seed)
}

func TestSimulation(t *testing.T) {
	t.Parallel()
	seeds := []uint64{}
	if *simSeed != 0 {
		seeds = append(seeds, *simSeed)
	} else {
		n := *simSeeds
		if n == 0 {
			n = 200
			if testing.Short() { // the quick loop (make test-short)
				n = 100
			}
			if raceEnabled { // the race detector makes a seed ~5x slower: a short version (make test runs the rest without it)
				n = 50
			}
		}
		for i := range uint64(n) {
			seeds = append(seeds, *simFirst+i)
		}
		if *simFirst == 1 {
			for _, seed := range simRegressionSeeds {
				if seed > uint64(n) {
					seeds = append(seeds, seed)
				}
			}
		}
	}
	var total simStats
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			var st simStats
			synctest.Test(t, func(t *testing.T) { st = simulate(t, seed) })
			st.lin = checkSimLinearizable(t, seed, st.linOps)
			total.add(st)
		})
	}
	t.Logf("%d seeds: %s", len(seeds), total)
	t.Logf("registers: %s", total.lin)
}

// simStats counts what the runs did.
type simStats struct {
	faults           map[string]int
	asksOK, asksFail int
	withheld         int // results withheld (StaleResultError)
	stubborn         int // handlers that ignored their context
	checkpoints      int // checkpoint writes the store accepted (each checked against the lock's epoch)

	reminderFires       int // reminder ticks fired (each checked: owner, order, exactness)
	reminderRedelivered int // of which after an unplanned loss (at least once)
	stateWrites         int // reminder writes the store accepted (each checked against the lock's epoch)

	workerRuns      int              // runs of singletons and shard workers (each checked: owner, no overlap)
	rememberedLives int              // lives of remembered entities (each checked: no overlap)
	lateRemembered  int              // entities remembered right before a graceful stop (each checked: lives on the next owner)
	lateExcused     int              // ... not checked: the ownership that answered was lost otherwise than by a release
	violations      int              // of the checks above (they fail the run unless the store is broken on purpose)
	linOps          []linearize.Op   // the registers' history (simulation_linearize_test.go)
	lin             linearize.Report // its check
}

func (s *simStats) add(o simStats) {
	if s.faults == nil {
		s.faults = map[string]int{}
	}
	for k, v := range o.faults {
		s.faults[k] += v
	}
	s.asksOK += o.asksOK
	s.asksFail += o.asksFail
	s.withheld += o.withheld
	s.stubborn += o.stubborn
	s.checkpoints += o.checkpoints
	s.reminderFires += o.reminderFires
	s.reminderRedelivered += o.reminderRedelivered
	s.stateWrites += o.stateWrites
	s.workerRuns += o.workerRuns
	s.rememberedLives += o.rememberedLives
	s.lateRemembered += o.lateRemembered
	s.lateExcused += o.lateExcused
	s.violations += o.violations
	s.lin.Add(o.lin)
}

func (s simStats) String() string {
	var kinds []string
	for k := range s.faults {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, s.faults[k]))
	}
	return fmt.Sprintf("faults [%s]; asks %d ok, %d failed; %d results withheld, %d stubborn handlers; %d checkpoints accepted, each under its lock's epoch"+
		"; reminders: %d ticks fired (%d redelivered after an unplanned loss), %d reminder writes accepted, each under its lock's epoch"+
		"; %d singleton and shard worker runs, %d lives of remembered entities, none overlapping; %d entities remembered right before a graceful stop, each living on the next owner (%d more not checked: the ownership that answered them lost)",
		strings.Join(parts, ", "), s.asksOK, s.asksFail, s.withheld, s.stubborn, s.checkpoints, s.reminderFires, s.reminderRedelivered, s.stateWrites,
		s.workerRuns, s.rememberedLives, s.lateRemembered, s.lateExcused)
}

// Simulation parameters.
const (
	simShards   = 8
	simEntities = 24
	simTTL      = 3 * time.Second
	simDuration = 20 * time.Second // faults happen in [0, simDuration)
)

// simCounter is the simulated entity: an increment counter whose handler
// takes a little virtual time, checkpoints on release and restores on
// activation; a stubborn call ignores its context while it sleeps, and then
// checkpoints (fenced, without a context to stop it: the write a zombie
// owner attempts after its shard moved); every third increment also
// checkpoints.
type simCounter struct {
	id      string
	n       int64
	epoch   int64
	persist func(context.Context, []byte) error
	w       *simWorld
}

type simReq struct {
	Sleep    time.Duration
	Stubborn bool
}

type simResp struct {
	N      int64
	Exec   int64 // the execution, for the acknowledgement check
	Runner string
	Epoch  int64
}

func (c *simCounter) Activate(ctx context.Context, info entity.ActivateInfo) error {
	c.epoch, c.persist = info.Epoch, info.Checkpoint
	data, ok, err := info.Restore(ctx)
	if err != nil || !ok {
		return err
	}
	_, err = fmt.Sscan(string(data), &c.n)
	return err
}

func (c *simCounter) Release(ctx context.Context, info entity.ReleaseInfo) error {
	err := info.Checkpoint(ctx, []byte(fmt.Sprint(c.n)))
	if err != nil { // the next owner restores an older value: state lost
		c.w.mu.Lock()
		c.w.lost = append(c.w.lost, time.Now())
		c.w.mu.Unlock()
	}
	return err
}

func (c *simCounter) Inc(ctx context.Context, r simReq) (simResp, error) {
	info, _ := runner.ShardInfoFrom(ctx)
	exec := c.w.begin(info, r.Stubborn)
	defer c.w.end(exec)
	defer c.w.rem.handled(c.id)
	if r.Stubborn {
		time.Sleep(r.Sleep)
	} else {
		select {
		case <-time.After(r.Sleep):
		case <-ctx.Done():
			return simResp{}, context.Cause(ctx)
		}
	}
	c.n++
	if r.Stubborn || c.n%3 == 0 {
		pctx := ctx
		if r.Stubborn {
			pctx = context.Background()
		}
		if err := c.persist(pctx, []byte(fmt.Sprint(c.n))); err != nil {
			return simResp{}, err
		}
	}
	return simResp{N: c.n, Exec: exec, Runner: info.Runner, Epoch: int64(info.Epoch)}, nil
}

// simNode is one runner incarnation of the simulation.
type simNode struct {
	id    string
	r     *runner.Runner
	store *memory.Store
	sub   *runner.Subscription
	done  chan struct{}
	dead  bool // crashed or shut down; a later incarnation may take the ID
}

// simRun is one seeded run.
type simRun struct {
	t       *testing.T
	seed    uint64
	rng     *rand.Rand
	c       *memory.Cluster
	net     *transport.InmemNetwork
	w       *simWorld
	kind    *entity.Kind[simCounter]
	inc     *entity.MethodRef[simCounter, simReq, simResp]
	log     *slog.Logger
	nodesMu sync.Mutex
	nodes   []*simNode
	ids     int
	sched   []string // the schedule, for the failure message
	stats   simStats
	lin     *simLin // the registers (simulation_linearize_test.go)
	opts    simOptions

	evMu sync.Mutex
	evs  []runner.Event
	wg   sync.WaitGroup
}

// simOptions break a run on purpose, for the tests proving the checks
// can fail.
type simOptions struct {
	unfenced bool // the store accepts checkpoints under any epoch
}

func simulate(t *testing.T, seed uint64, opts ...simOptions) simStats {
	s := &simRun{
		t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, seed*0x9e3779b97f4a7c15+1)),
		c: memory.NewCluster(), net: transport.NewInmemNetwork(),
		w:     &simWorld{active: map[sharding.ShardID]map[int64]simExec{}, overlapped: map[int64]bool{}, started: map[int64]time.Time{}},
		stats: simStats{faults: map[string]int{}},
		log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if *simLog {
		s.log = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	s.kind = entity.NewKind("counter", func(id string) *simCounter { return &simCounter{id: id, w: s.w} })
	s.inc = entity.Method(s.kind, "inc", (*simCounter).Inc)
	s.w.rem = newSimReminders(s.kind)
	s.w.always = newSimAlways()
	s.lin = newSimLin(s.w)
	if len(opts) > 0 {
		s.opts = opts[0]
	}
	defer s.c.Close()
	s.c.DisableFencing(s.opts.unfenced)
	gw := s.startNode("gw", true)
	for range 3 {
		s.startNode("", false)
	}
	s.armAll(gw)
	s.activateRemembered(gw)
	load := s.drive(gw)
	s.lin.drive(seed, gw.r)
	s.schedule()
	close(load.stop)
	load.wg.Wait()
	s.lin.halt()
	s.heal()
	s.converge()
	converged := time.Now()
	// Reminders fire again: a tick waits in its entity's mailbox behind
	// the handler running there, and the stubborn ones outlive the load.
	for s.w.stubbornRunning() {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(simRemindersPeriod + 2*time.Second)
	observed := time.Now()
	s.checkAlwaysLive()
	for _, n := range s.nodes {
		if !n.dead {
			n.r.Close()
			<-n.done
		}
		n.sub.Close()
	}
	s.wg.Wait()
	// Handlers that ignore their context outlive their runner (nothing can
	// stop them): the bubble ends after the last one.
	for s.w.running() > 0 {
		time.Sleep(100 * time.Millisecond)
	}
	s.check(load)
	s.checkReminders(converged, observed)
	s.checkAlways()
	s.stats.linOps = s.lin.history()
	s.reportViolations()
	return s.stats
}

func (s *simRun) note(format string, args ...any) {
	line := fmt.Sprintf("%6.2fs ", time.Since(simStart).Seconds()) + fmt.Sprintf(format, args...)
	s.sched = append(s.sched, line)
	if *simLog {
		s.t.Log(line)
	}
}

// simStart is the bubble's start: synctest starts every bubble at
// midnight UTC 2000-01-01.
var simStart = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func (s *simRun) startNode(id string, gateway bool) *simNode {
	s.nodesMu.Lock()
	if id == "" {
		s.ids++
		id = fmt.Sprintf("r%d", s.ids)
	}
	s.nodesMu.Unlock()
	cfg := runner.Config{
		ID: id, NumShards: simShards, LeaseTTL: simTTL, Logger: s.log.With("node", id),
		Transport: s.net.Transport(id + ":7100"), HandoffWait: 3 * time.Second, WarmTimeout: time.Second,
		DrainTimeout: time.Second, ClientOnly: gateway,
	}
	st := s.c.NewStore(id)
	r, err := runner.New(st, cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := r.Register(s.kind, s.lin.kind); err != nil {
		s.t.Fatal(err)
	}
	if err := s.w.always.install(r); err != nil {
		s.t.Fatal(err)
	}
	n := &simNode{id: id, r: r, store: st, sub: r.Subscribe(), done: make(chan struct{})}
	s.wg.Go(func() {
		for ev := range n.sub.Events() {
			s.evMu.Lock()
			s.evs = append(s.evs, ev)
			s.evMu.Unlock()
		}
	})
	go func() { defer close(n.done); _ = r.Run(context.Background()) }()
	for r.Status().Phase == "new" {
		time.Sleep(time.Millisecond)
	}
	s.nodesMu.Lock()
	s.nodes = append(s.nodes, n)
	s.nodesMu.Unlock()
	return n
}

// live returns the hosting nodes that run.
func (s *simRun) live() []*simNode {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	var out []*simNode
	for _, n := range s.nodes {
		if !n.dead && !n.r.Config().ClientOnly {
			out = append(out, n)
		}
	}
	return out
}

// simLoad is the gateway's traffic: one ask at a time per caller.
type simLoad struct {
	stop   chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	acks   map[string][]simAck // by entity, in ack order
	failed int
}

type simAck struct {
	n      int64
	exec   int64
	at     time.Time
	runner string
	epoch  int64
}

func (s *simRun) drive(gw *simNode) *simLoad {
	l := &simLoad{stop: make(chan struct{}), acks: map[string][]simAck{}}
	for caller := range 4 {
		// Each caller's timing and requests come from its own seeded
		// stream, so they do not depend on the others' progress.
		rng := rand.New(rand.NewPCG(s.seed, uint64(caller)+100))
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				case <-time.After(time.Duration(5+rng.IntN(40)) * time.Millisecond):
				}
				id := fmt.Sprintf("e%d", rng.IntN(simEntities))
				req := simReq{Sleep: time.Duration(rng.IntN(30)) * time.Millisecond}
				if rng.IntN(40) == 0 {
					req = simReq{Sleep: time.Duration(1+rng.IntN(6)) * time.Second, Stubborn: true}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := s.inc.Ask(ctx, gw.r, id, req)
				cancel()
				l.mu.Lock()
				if req.Stubborn {
					s.stats.stubborn++
				}
				var stale *runner.StaleResultError
				switch {
				case err == nil:
					l.acks[id] = append(l.acks[id], simAck{n: resp.N, exec: resp.Exec, at: time.Now(), runner: resp.Runner, epoch: resp.Epoch})
				case errors.As(err, &stale):
					s.stats.withheld++
					l.failed++
				default:
					l.failed++
				}
				l.mu.Unlock()
			}
		})
	}
	return l
}

// The faults of the schedule.
var simFaults = []string{"crash", "shutdown", "store-partition", "keepalive-fail", "expire-lease",
	"net-isolate", "lose-answers", "join", "store-delay", "late-writes"}

// schedule runs the seeded faults over simDuration, then waits for the
// last to heal.
func (s *simRun) schedule() {
	end := simStart.Add(simDuration)
	var healers sync.WaitGroup
	defer healers.Wait()
	for {
		time.Sleep(time.Duration(500+s.rng.IntN(2500)) * time.Millisecond)
		if time.Now().After(end) {
			return
		}
		fault := simFaults[s.rng.IntN(len(simFaults))]
		live := s.live()
		if len(live) == 0 {
			fault = "join"
		}
		var n *simNode
		if len(live) > 0 {
			n = live[s.rng.IntN(len(live))]
		}
		d := time.Duration(500+s.rng.IntN(int(2*simTTL/time.Millisecond))) * time.Millisecond
		s.stats.faults[fault]++
		switch fault {
		case "crash", "shutdown":
			if len(live) <= 1 {
				s.stats.faults[fault]--
				continue
			}
			s.note("%s %s, back after %v", fault, n.id, d)
			if fault == "crash" {
				n.r.Close()
			} else {
				s.rememberBeforeStop(n)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_ = n.r.Shutdown(ctx)
				cancel()
			}
			<-n.done
			s.nodesMu.Lock()
			n.dead = true
			s.nodesMu.Unlock()
			id := n.id
			healers.Go(func() { time.Sleep(d); s.startNode(id, false) })
		case "store-partition":
			s.note("store partition of %s for %v", n.id, d)
			n.store.Partition(true)
			healers.Go(func() { time.Sleep(d); n.store.Partition(false) })
		case "keepalive-fail":
			s.note("keep-alives of %s fail for %v", n.id, d)
			n.store.FailKeepAlive(true)
			healers.Go(func() { time.Sleep(d); n.store.FailKeepAlive(false) })
		case "store-delay":
			s.note("store calls of %s delayed 400ms for %v", n.id, d)
			for _, op := range []memory.Op{memory.OpAcquire, memory.OpVerify, memory.OpTransfer, memory.OpHandoff, memory.OpKeepAlive} {
				n.store.Delay(op, 400*time.Millisecond)
			}
			healers.Go(func() {
				time.Sleep(d)
				for _, op := range []memory.Op{memory.OpAcquire, memory.OpVerify, memory.OpTransfer, memory.OpHandoff, memory.OpKeepAlive} {
					n.store.Delay(op, 0)
				}
			})
		case "late-writes":
			// Checkpoint and shard state writes fail as unavailable and
			// land later, possibly after newer ones: etcd requests left in
			// flight by a timeout.
			late := time.Duration(50+s.rng.IntN(1000)) * time.Millisecond
			s.note("checkpoint and shard state writes of %s fail and land %v later, for %v", n.id, late, d)
			n.store.LateWrites(memory.OpCheckpoint, late)
			n.store.LateWrites(memory.OpShardState, late)
			healers.Go(func() {
				time.Sleep(d)
				n.store.LateWrites(memory.OpCheckpoint, 0)
				n.store.LateWrites(memory.OpShardState, 0)
			})
		case "expire-lease":
			// The runner cannot renew for longer than its TTL: it detaches
			// at its deadline - margin, then the store expires its lease.
			// (An expiry before the runner's deadline, as etcd's early
			// revocation after a leader freeze, is outside the model: no
			// runner can stop a handler it cannot know is late.)
			d := simTTL + time.Duration(s.rng.IntN(2000))*time.Millisecond
			s.note("keep-alives of %s fail for %v: its lease expires", n.id, d)
			n.store.FailKeepAlive(true)
			healers.Go(func() { time.Sleep(d); n.store.FailKeepAlive(false) })
		case "net-isolate":
			s.note("%s isolated from its peers for %v", n.id, d)
			addr := n.id + ":7100"
			s.net.Isolate(addr, true)
			healers.Go(func() { time.Sleep(d); s.net.Isolate(addr, false) })
		case "lose-answers":
			s.note("answers of %s lost for %v", n.id, d)
			addr := n.id + ":7100"
			s.net.LoseAnswers(addr, true)
			healers.Go(func() { time.Sleep(d); s.net.LoseAnswers(addr, false) })
		case "join":
			if len(live) >= 5 {
				s.stats.faults[fault]--
				continue
			}
			s.note("a runner joins")
			s.startNode("", false)
		}
	}
}

// heal ends every fault (the schedule's healers have run).
func (s *simRun) heal() { s.note("all faults healed") }

// converge waits for every shard to be owned exactly once by its assignee.
func (s *simRun) converge() {
	limit := 2*simTTL + 3*time.Second + time.Second // 2 x TTL + HandoffWait + recompute slack
	deadline := time.Now().Add(limit)
	for {
		ok, why := simPartitionOK(s.live())
		if ok {
			s.note("converged")
			return
		}
		if time.Now().After(deadline) {
			s.w.violate("no convergence %v after the last fault healed: %s", limit, why)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
