package runner_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/detachment"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// The etcd fault matrix of issue 14: three runners with the default
// configuration on a 3-member etcd cluster, each runner's client reaching
// every member through a proxy of its own, under ask load. No fault that
// leaves a quorum reachable may detach a runner or fail an ask, and no
// shard may ever be owned twice.
//
// A second exception is the machine's: runner.Config's LeaseTTL states that
// the process must not be descheduled for longer than a renewal's window
// (LeaseTTL - DetachMargin - LeaseRenewInterval, 2.5 s at the defaults). A
// detach at the lease deadline after which a stall probe measured this
// process unscheduled at least that long since the last acknowledged
// renewal was sent (the deadline - TTL) is logged as STARVED, with the
// asks that failed then; it does not fail the test.
//
// One exception is etcd's, not shardhost's, and the tests tell it apart:
// a leader frozen (SIGSTOP) for longer than a lease's TTL, on resuming,
// revokes the leases it saw expire during the freeze, although the new
// leader kept them alive (etcd v3.6.16; see faultEnv.serverRevoked). The
// runners then lose their locks with their own lease deadline still seconds
// away, and detach at once through their watches. Such a detach is logged
// as ETCD-BUG and counted as server_revokes; it does not fail the test
// (nothing in shardhost can prevent it), every other detach does.
//
// `make test` runs one short run of each fault. The long variant runs 10
// runs of each, with the one-member faults held for 60 s:
//
//	SHARDHOST_LONG_FAULTS=1 go test -count=1 -timeout 60m -run '^TestEtcdFault' -v ./runner/
//
// SHARDHOST_FAULT_RUNS=n overrides the number of runs (short or long).
// SHARDHOST_FAULT_RAFT=heartbeat,election (e.g. "100ms,1s", etcd's own
// defaults) replaces testenv's raft timing (50 ms, 500 ms);
// SHARDHOST_FAULT_ETCD_LOG=info sets the members' log level, and
// SHARDHOST_KEEP_LOGS=dir keeps their logs when a test fails.
// Each run logs a line "RESULT fault=... run=... detaches=... failed_asks=..."
// with the hedged-call counts of the runners' stores.

// oneFaultAtATime lets one test of the matrix run at a time: each runs in
// parallel with the package's lighter tests (it mostly waits out its fault
// holds), never with another three-member cluster under ask load.
var oneFaultAtATime = make(chan struct{}, 1)

// faultPlan returns how many runs of each fault to do and whether the long
// variant (60 s one-member faults) is on.
func faultPlan(t *testing.T) (runs int, long bool) {
	t.Helper()
	long = os.Getenv("SHARDHOST_LONG_FAULTS") != ""
	runs = 1
	if long {
		runs = 10
	}
	if s := os.Getenv("SHARDHOST_FAULT_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("SHARDHOST_FAULT_RUNS=%q: want a positive integer", s)
		}
		runs = n
	}
	return runs, long
}

// faultEnv is the cluster, the runners and the load of one fault kind.
type faultEnv struct {
	pc     *testenv.ProxiedCluster
	c      *cluster
	rs     []*etcdRunner
	stores []*etcd.Store
	who    *whoEnv

	ok, failed atomic.Int64
	failMu     sync.Mutex
	failures   []string // first few failed asks
	stop       chan struct{}
	wg         sync.WaitGroup
	maxStall   atomic.Int64 // longest scheduling delay of a 10 ms ticker, ns
}

// startWithClientConfig runs a runner like cluster.start, but with the
// client configuration shardhost recommends (etcd.ClientConfig), and
// returns its store.
func (c *cluster) startWithClientConfig(cfg runner.Config, endpoints []string) (*etcdRunner, *etcd.Store) {
	t := c.t
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = logger(t)
	}
	ccfg := etcd.ClientConfig(endpoints)
	ccfg.Logger = zap.NewNop()
	cli, err := clientv3.New(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	s, err := etcd.New(cli, c.ns, etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := runner.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	er := &etcdRunner{Runner: r, t: t, sub: r.Subscribe(), done: make(chan error, 1)}
	c.rec.follow(er.sub)
	go func() { er.done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		er.stop()
		er.sub.Close()
	})
	return er, s
}

// newFaultEnv starts the cluster and three runners with the default
// configuration (NumShards, LeaseTTL, margins, intervals, timeouts), waits
// for an exact partition and starts the load: 6 callers, each asking its
// own 64 entities through one of the runners (local or one hop) about 250
// times a second (1 500 asks/s in all), each ask with a 5 s timeout.
func newFaultEnv(t *testing.T) *faultEnv {
	t.Helper()
	var opts []testenv.EtcdOption
	if s := os.Getenv("SHARDHOST_FAULT_RAFT"); s != "" {
		hb, el, _ := strings.Cut(s, ",")
		h, err1 := time.ParseDuration(hb)
		e, err2 := time.ParseDuration(el)
		if err1 != nil || err2 != nil {
			t.Fatalf("SHARDHOST_FAULT_RAFT=%q: want heartbeat,election", s)
		}
		opts = append(opts, testenv.WithRaftTiming(h, e))
	}
	if s := os.Getenv("SHARDHOST_FAULT_ETCD_LOG"); s != "" {
		opts = append(opts, testenv.WithLogLevel(s))
	}
	pc := testenv.StartProxiedEtcdCluster(t, 3, opts...)
	e := &faultEnv{pc: pc, c: newCluster(t, pc.Endpoints(), pc.Client(t)), stop: make(chan struct{})}
	env, k, method := newWho()
	e.who = env
	for _, id := range []string{"a", "b", "c"} {
		r, s := e.c.startWithClientConfig(runner.Config{ID: id, ListenAddr: "127.0.0.1:0"}, pc.ProxiedEndpoints())
		if err := r.Register(k); err != nil {
			t.Fatal(err)
		}
		e.rs, e.stores = append(e.rs, r), append(e.stores, s)
	}
	if ttl := e.rs[0].Config().LeaseTTL; ttl != runner.DefaultLeaseTTL {
		t.Fatalf("LeaseTTL %v, want the default %v", ttl, runner.DefaultLeaseTTL)
	}
	e.c.waitPartition(e.rs, runner.DefaultNumShards, 60*time.Second)
	for g := range 6 {
		e.wg.Go(func() {
			via := e.rs[g%len(e.rs)]
			tick := time.NewTicker(4 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-e.stop:
					return
				case <-tick.C:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := method.Ask(ctx, via, fmt.Sprintf("e%d-%d", g, i%64), whoReq{})
				cancel()
				if err != nil {
					if e.failed.Add(1) <= 5 {
						e.failMu.Lock()
						e.failures = append(e.failures, fmt.Sprintf("%s via %s: %v", time.Now().Format(time.StampMilli), via.ID(), err))
						e.failMu.Unlock()
					}
				} else {
					e.ok.Add(1)
				}
			}
		})
	}
	// The machine is shared: a process that is not scheduled cannot renew
	// its lease. Record the longest delay of a 10 ms ticker, so that a
	// detach caused by the machine is told apart from one caused by etcd.
	e.wg.Go(func() {
		const every = 10 * time.Millisecond
		tick := time.NewTicker(every)
		defer tick.Stop()
		last := time.Now()
		for {
			select {
			case <-e.stop:
				return
			case now := <-tick.C:
				if d := int64(now.Sub(last) - every); d > e.maxStall.Load() {
					e.maxStall.Store(d)
				}
				last = now
			}
		}
	})
	t.Cleanup(func() { close(e.stop); e.wg.Wait() })
	e.asksFlow(t, "before the faults")
	return e
}

// asksFlow waits until 300 more asks succeeded.
func (e *faultEnv) asksFlow(t *testing.T, what string) {
	t.Helper()
	from := e.ok.Load()
	waitFor(t, 30*time.Second, "asks succeeding "+what, func() bool { return e.ok.Load() >= from+300 })
}

func (e *faultEnv) detaches() []runner.Detached { return detachedEvents(e.c.rec.all()) }

func (e *faultEnv) hedgeStats() etcd.Stats {
	var sum etcd.Stats
	for _, s := range e.stores {
		st := s.Stats()
		sum.Calls += st.Calls
		sum.Attempts += st.Attempts
		sum.Hedged += st.Hedged
		sum.Failed += st.Failed
	}
	return sum
}

// runResult is what one run of a fault did.
type runResult struct {
	detaches      int // detaches shardhost decided (deadline, streak, storage errors)
	serverRevokes int // detaches forced by etcd revoking a lease early
	starved       int // detaches at the deadline of a runner descheduled beyond its renewal window
	failedAsks    int64
}

// leaseAt returns the lease runner id registered last before t.
func (e *faultEnv) leaseAt(id string, t time.Time) storage.LeaseID {
	var l storage.LeaseID
	for _, ev := range e.c.rec.all() {
		if r, ok := ev.(runner.Registered); ok && r.Runner == id && r.Time.Before(t) {
			l = r.Lease
		}
	}
	return l
}

// serverRevoked reports whether detach d was forced by etcd: the runner's
// locks or lease disappeared while its own lease deadline was still more
// than the detach margin away, and etcd no longer has the lease it held.
// etcd v3.6.16 does this when a leader frozen (SIGSTOP) for longer than a
// lease's TTL resumes: for the moment its raft loop ticks again,
// ensureLeadership trusts it (the isActive shortcut of etcd PR 18428), so
// its lessor's revocations of the leases it saw expire during the freeze
// are proposed, forwarded to the new leader once it steps down and
// committed, although the new leader had kept them alive.
func (e *faultEnv) serverRevoked(t *testing.T, d runner.Detached) (bool, storage.LeaseID) {
	t.Helper()
	if d.Reason != detachment.ReasonLockLost && d.Reason != detachment.ReasonLeaseLost {
		return false, 0
	}
	if !d.Time.Before(d.Deadline.Add(-e.rs[0].Config().DetachMargin)) {
		return false, 0
	}
	l := e.leaseAt(d.Runner, d.Time)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ttl, err := e.c.direct.TimeToLive(ctx, clientv3.LeaseID(l))
	if err != nil {
		t.Fatalf("TimeToLive(%x): %v", l, err)
	}
	return ttl.TTL == -1, l
}

// check waits until the partition is exact and asks flow again, then
// reports the run: it fails the test for a detach shardhost decided, for a
// failed ask (unless etcd revoked a lease early in this run: that outage is
// etcd's), for a shard owned twice and for an entity that ran two handlers
// at once. It logs the run's result line.
func (e *faultEnv) check(t *testing.T, fault string, run int, since time.Time, st0 etcd.Stats, ok0, failed0 int64) runResult {
	t.Helper()
	e.c.waitPartition(e.rs, runner.DefaultNumShards, 60*time.Second)
	e.asksFlow(t, "after the fault")
	var res runResult
	revokedEarly := map[string]time.Time{} // runner -> its detach after etcd revoked its lease early
	for _, d := range e.detaches() {
		if d.Time.Before(since) {
			continue
		}
		if starved, stalled, window := e.c.starved(d, e.rs[0].Config()); starved {
			res.starved++
			t.Logf("STARVED: %s detached at %s (%s: %s): this process was measured unscheduled %v since its last acknowledged renewal was sent, more than a renewal's window (%v)",
				d.Runner, d.Time.Format(time.StampMilli), d.Reason, d.Detail, stalled.Round(time.Millisecond), window)
			continue
		}
		if revoked, l := e.serverRevoked(t, d); revoked {
			res.serverRevokes++
			t.Logf("ETCD-BUG: %s detached at %s (%s: %s) with its lease deadline still %v away: etcd revoked its lease %x early",
				d.Runner, d.Time.Format(time.StampMilli), d.Reason, d.Detail, d.Deadline.Sub(d.Time).Round(time.Millisecond), l)
			revokedEarly[d.Runner] = d.Time
			continue
		}
		res.detaches++
		t.Errorf("%s detached at %s: %s: %s", d.Runner, d.Time.Format(time.StampMilli), d.Reason, d.Detail)
	}
	res.failedAsks = e.failed.Load() - failed0
	e.failMu.Lock()
	if res.failedAsks > 0 && res.serverRevokes == 0 && res.starved == 0 {
		t.Errorf("%d asks failed; first: %q", res.failedAsks, e.failures)
	} else if res.failedAsks > 0 {
		t.Logf("%d asks failed during etcd's early revocation or a starved runner's detach; first: %q", res.failedAsks, e.failures)
	}
	e.failures = nil
	e.failMu.Unlock()
	st := e.hedgeStats()
	t.Logf("RESULT fault=%s run=%d detaches=%d starved=%d server_revokes=%d failed_asks=%d ok_asks=%d hedged_calls=%d/%d attempts=%d unanswered_calls=%d max_stall=%v load=%s",
		fault, run, res.detaches, res.starved, res.serverRevokes, res.failedAsks, e.ok.Load()-ok0, st.Hedged-st0.Hedged, st.Calls-st0.Calls, st.Attempts-st0.Attempts, st.Failed-st0.Failed,
		time.Duration(e.maxStall.Swap(0)).Round(time.Millisecond), loadAvg())
	checkSingleOwnerUnlessRevokedEarly(t, e.c.rec.all(), revokedEarly)
	e.who.mu.Lock()
	if len(e.who.overlap) > 0 {
		t.Errorf("%d concurrent handlers of one entity, first: %s", len(e.who.overlap), e.who.overlap[0])
	}
	e.who.mu.Unlock()
	return res
}

// runFault runs inject runs times on a fresh environment and logs a
// summary line.
func runFault(t *testing.T, name string, inject func(t *testing.T, e *faultEnv, run int)) {
	t.Parallel()
	oneFaultAtATime <- struct{}{}
	t.Cleanup(func() { <-oneFaultAtATime })
	runs, _ := faultPlan(t)
	e := newFaultEnv(t)
	var sum runResult
	bad := 0
	for run := range runs {
		st0, ok0, failed0 := e.hedgeStats(), e.ok.Load(), e.failed.Load()
		start := time.Now()
		inject(t, e, run)
		// Renewals and verifications that were slowed down may still fail
		// after the fault ended: watch one more TTL.
		time.Sleep(runner.DefaultLeaseTTL)
		res := e.check(t, name, run, start, st0, ok0, failed0)
		sum.detaches += res.detaches
		sum.serverRevokes += res.serverRevokes
		sum.starved += res.starved
		sum.failedAsks += res.failedAsks
		if res.detaches+res.serverRevokes+res.starved > 0 || res.failedAsks > 0 {
			bad++
		}
		t.Logf("run %d of %s done in %v", run, name, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("SUMMARY fault=%s runs=%d runs_with_a_detach_or_failed_ask=%d detaches=%d starved=%d server_revokes=%d failed_asks=%d",
		name, runs, bad, sum.detaches, sum.starved, sum.serverRevokes, sum.failedAsks)
}

func stamp() string { return time.Now().UTC().Format("15:04:05.000") }

// loadAvg returns the machine's 1-minute load average ("?" when unknown).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

func oneMemberHold(long bool, short time.Duration) time.Duration {
	if long {
		return 60 * time.Second
	}
	return short
}

// (a) One member black-holed (every byte to and from its proxy dropped;
// connections stay open). Runs rotate over the members, so the leader is
// black-holed too. The short hold (15 s) covers the time the client's
// balancer keeps sending to the dead member (until gRPC keepalive drops
// the connection after about 12 s).
func TestEtcdFaultBlackholeOneMember(t *testing.T) {
	_, long := faultPlan(t)
	hold := oneMemberHold(long, 15*time.Second)
	runFault(t, "blackhole-one-member", func(t *testing.T, e *faultEnv, run int) {
		m := e.pc.Members()[run%3]
		leader := e.pc.Leader(t)
		t.Logf("%s run %d: black-holing member %s (leader %s) for %v", stamp(), run, m.Name(), leader.Name(), hold)
		p := e.pc.ProxyOf(m)
		p.Blackhole(t)
		time.Sleep(hold)
		p.Clear(t)
	})
}

// (b) SIGKILL of the raft leader; it is restarted after one TTL.
func TestEtcdFaultKillLeader(t *testing.T) {
	runFault(t, "kill-leader", func(t *testing.T, e *faultEnv, run int) {
		leader := e.pc.Leader(t)
		t.Logf("%s run %d: killing the leader %s", stamp(), run, leader.Name())
		leader.Kill()
		time.Sleep(runner.DefaultLeaseTTL)
		leader.Restart(t)
		e.pc.WaitReady(t)
	})
}

// (c) SIGSTOP of the raft leader for 3 s, then (after the runners settled)
// of the new leader for 2 x TTL.
func TestEtcdFaultPauseLeader(t *testing.T) {
	runFault(t, "pause-leader", func(t *testing.T, e *faultEnv, run int) {
		for _, d := range []time.Duration{3 * time.Second, 2 * runner.DefaultLeaseTTL} {
			leader := e.pc.Leader(t)
			t.Logf("%s run %d: pausing the leader %s for %v", stamp(), run, leader.Name(), d)
			leader.Pause()
			time.Sleep(d)
			leader.Resume()
			t.Logf("%s run %d: resumed %s", stamp(), run, leader.Name())
			e.pc.WaitReady(t)
			if d < 2*runner.DefaultLeaseTTL {
				time.Sleep(runner.DefaultLeaseTTL)
				e.asksFlow(t, "after the 3 s pause")
			}
		}
	})
}

// (d) 1 s of latency on every reply of one member (runs rotate over the
// members).
func TestEtcdFaultLatencyOneMember(t *testing.T) {
	_, long := faultPlan(t)
	hold := oneMemberHold(long, 10*time.Second)
	runFault(t, "latency-one-member", func(t *testing.T, e *faultEnv, run int) {
		m := e.pc.Members()[run%3]
		t.Logf("%s run %d: 1 s latency on member %s for %v", stamp(), run, m.Name(), hold)
		p := e.pc.ProxyOf(m)
		p.Latency(t, time.Second)
		time.Sleep(hold)
		p.Clear(t)
	})
}
