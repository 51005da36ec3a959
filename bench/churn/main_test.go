package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
)

func TestMain(m *testing.M) {
	runnerproc.Main() // the children of a -procs run
	loadChildMain()   // the load child
	goleak.VerifyTestMain(m)
}

// shared is the one churn run the tests below look at (about 10 s).
var shared struct {
	once sync.Once
	rep  *Report
	log  bytes.Buffer
	err  error
}

// churnRun runs three churn steps (a shutdown, an add and a crash) with
// small numbers on the ./bin/etcd it starts, once per test binary;
// Duration only bounds a very slow machine.
func churnRun(t *testing.T) *Report {
	t.Helper()
	testenv.SkipIfShort(t, "runs the churn harness on a real etcd")
	testenv.OnFailure(t, nil) // the replay command
	if _, err := etcdBinary(); err != nil {
		t.Fatalf("churn harness needs ./bin/etcd: %v", err)
	}
	shared.once.Do(func() {
		p := Params{
			Runners: 3, Shards: 32, TTL: 2 * time.Second, Callers: 4, Entities: 200,
			Duration: 90 * time.Second, Steps: 3, Every: 1500 * time.Millisecond, Crash: true,
			Seed: 6, // first steps: shutdown, add, crash
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		shared.rep, shared.err = run(ctx, p, &shared.log)
	})
	if shared.err != nil {
		t.Fatalf("%v\n%s", shared.err, shared.log.String())
	}
	return shared.rep
}

// TestChurn checks the run: no double ownership, every step kind, asks
// succeeded, and every shard a crash lost answered by its new owner.
func TestChurn(t *testing.T) {
	rep := churnRun(t)
	var b strings.Builder
	rep.print(&b)
	t.Log("\n" + shared.log.String() + b.String())
	if rep.DoubleOwnership != 0 {
		t.Errorf("%d double-ownership violations, want 0", rep.DoubleOwnership)
	}
	if len(rep.Steps) == 0 {
		t.Fatal("no churn step happened")
	}
	for _, k := range stepKinds {
		if rep.StepCounts[k] == 0 {
			t.Errorf("steps %v: want at least one %s", rep.StepCounts, k)
		}
	}
	if rep.Asks.OK == 0 {
		t.Error("no ask succeeded")
	}
	if d := rep.Cutover["crash-first-ask"]; d.N == 0 || d.N != rep.Cutover["crash"].N || rep.FirstAskUnanswered != 0 {
		t.Errorf("first asks after a crash measured for %d of %d shards taken over, %d unanswered; want all, none unanswered",
			d.N, rep.Cutover["crash"].N, rep.FirstAskUnanswered)
	}
}

// TestMissingEtcdBinary: without bin/etcd the error says to run make setup.
func TestMissingEtcdBinary(t *testing.T) {
	t.Setenv("SHARDHOST_BIN", t.TempDir())
	_, err := openEtcd(context.Background(), "")
	if err == nil || !strings.Contains(err.Error(), "make setup") {
		t.Fatalf("openEtcd without a binary: %v, want an error saying to run `make setup`", err)
	}
}

func TestClassify(t *testing.T) {
	deadline := fmt.Errorf("not delivered: %w (last attempt: %w)", context.DeadlineExceeded, &runner.NotOwnerError{Shard: 1})
	for err, want := range map[error]string{
		fmt.Errorf("to r1: %w", runner.ErrMaybeDelivered): classMaybeDelivered,
		deadline:                        classDeadline,
		&runner.NotOwnerError{Shard: 1}: classNotOwner,
		&runner.UndeliveredError{Shard: 1, Cause: runner.ErrShutdown}: classUndelivered,
		errors.New("boom"): classOther,
	} {
		if got := classify(err); got != want {
			t.Errorf("classify(%v) = %s, want %s", err, got, want)
		}
	}
}

// TestBurstParams: -burst must leave 2 runners after a leave burst, and
// its steps alternate joins and leaves, joins first.
func TestBurstParams(t *testing.T) {
	base := Params{Runners: 12, Shards: 64, Callers: 1, Entities: 1, Duration: time.Second, Every: time.Second}
	for burst, ok := range map[int]bool{0: true, 10: true, 11: false, -1: false} {
		p := base
		p.Burst = burst
		if err := p.validate(); (err == nil) != ok {
			t.Errorf("validate(-runners 12 -burst %d) = %v, want ok %v", burst, err, ok)
		}
	}
	h := &harness{p: base}
	h.p.Burst = 10
	var got []string
	for range 4 {
		k := h.pick()
		got = append(got, k)
		h.steps = append(h.steps, step{Kind: k})
	}
	if want := []string{stepBurstJoin, stepBurstLeave, stepBurstJoin, stepBurstLeave}; !slices.Equal(got, want) {
		t.Errorf("burst steps %v, want %v", got, want)
	}
}

// TestChurnStepCosts: every step's cost names the shards it moved (the
// planned and crash cutovers completed in it, all of them counted once),
// the watch deliveries and requests per moved shard, and CPU split into
// the runners', etcd's and the load child's; the load alone is measured
// between the steps.
func TestChurnStepCosts(t *testing.T) {
	rep := churnRun(t)
	if rep.Params.InProcessLoad {
		t.Fatal("the shared run has the load in this process; want it in the load child")
	}
	moved := 0
	for i, s := range rep.Steps {
		c := s.Cost
		moved += c.Moved
		if c.Moved == 0 || c.WatchEvents == 0 || c.Requests == 0 {
			t.Errorf("step %d (%s): moved %d, watch events %.0f, requests %.0f; want all positive", i+1, s.Kind, c.Moved, c.WatchEvents, c.Requests)
			continue
		}
		if got, want := c.WatchEventsPerMoved, c.WatchEvents/float64(c.Moved); got != want {
			t.Errorf("step %d: watch events per moved shard %g, want %g", i+1, got, want)
		}
		if got, want := c.RequestsPerMoved, c.Requests/float64(c.Moved); got != want {
			t.Errorf("step %d: requests per moved shard %g, want %g", i+1, got, want)
		}
		if c.RunnersCPU <= 0 || c.LoadCPU <= 0 || c.ChangeCPU != c.RunnersCPU+c.EtcdCPU {
			t.Errorf("step %d: CPU runners %g, etcd %g, change %g, callers and gateway %g; want runners and load measured, change = runners + etcd",
				i+1, c.RunnersCPU, c.EtcdCPU, c.ChangeCPU, c.LoadCPU)
		}
	}
	if want := rep.Cutover["planned"].N + rep.Cutover["crash"].N; moved != want {
		t.Errorf("the steps moved %d shards in all, want the %d cutovers of the run", moved, want)
	}
	if b := rep.Between; b == nil || b.Window <= 0 || b.RunnersCPUPercent <= 0 || b.LoadCPUPercent <= 0 {
		t.Errorf("between steps: %+v, want the load alone measured", b)
	}
	var out strings.Builder
	rep.print(&out)
	for _, col := range []string{"/moved", "callers+gw", "change", "between steps", "step (each)"} {
		if !strings.Contains(out.String(), col) {
			t.Errorf("the printed report has no %q", col)
		}
	}
}

// TestColdStartGivenUpIsReported: a cold start that does not finish in
// time ends the run with a report saying so and how far it got, not with
// an error and nothing.
func TestColdStartGivenUpIsReported(t *testing.T) {
	if _, err := etcdBinary(); err != nil {
		t.Fatalf("churn harness needs ./bin/etcd: %v", err)
	}
	p := Params{
		Runners: 3, Shards: 32, TTL: 2 * time.Second, Callers: 1, Entities: 10,
		Duration: time.Minute, Every: time.Second, Seed: 1,
		ColdTimeout: time.Nanosecond, Progress: time.Hour, // no sample but the last
	}
	var log bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := run(ctx, p, &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if rep.ColdDone || len(rep.Steps) != 0 {
		t.Errorf("cold start done %v, %d steps; want given up before any step", rep.ColdDone, len(rep.Steps))
	}
	if len(rep.ColdProgress) != 1 || rep.ColdProgress[0].Registered < 0 || rep.ColdProgress[0].Locks < 0 {
		t.Errorf("cold start progress %+v, want one sample (the last) with etcd's counts", rep.ColdProgress)
	}
	if len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], "did not settle") {
		t.Errorf("problems %q, want the cold start's only", rep.Problems)
	}
	var out strings.Builder
	rep.print(&out)
	if !strings.Contains(out.String(), "NOT every shard owned") || !strings.Contains(out.String(), "cold start progress") {
		t.Errorf("the printed report does not say the cold start was given up, with its progress:\n%s", out.String())
	}
	if err := rep.writeHTML(io.Discard); err != nil {
		t.Errorf("writeHTML: %v", err)
	}
}

// TestWatchEventsCountOnePerEventPerWatcher: the metric a step's watch
// deliveries are read from counts each event once per watch it matches:
// 5 puts under a prefix that 3 watches (2 on one client, 1 on another)
// follow are 15, and a watch of another prefix adds none.
func TestWatchEventsCountOnePerEventPerWatcher(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := startEtcd(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var clis []*clientv3.Client
	for range 2 {
		cli, err := newEtcdClient(e.Endpoint, false)
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		clis = append(clis, cli)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	watch := func(cli *clientv3.Client, prefix string) clientv3.WatchChan {
		ch := cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		if wr := <-ch; !wr.Created {
			t.Fatalf("watch of %s not created: %v", prefix, wr.Err())
		}
		return ch
	}
	chans := []clientv3.WatchChan{watch(clis[0], "/w/"), watch(clis[0], "/w/"), watch(clis[1], "/w/")}
	watch(clis[1], "/other/")
	m0, err := etcdMetrics(ctx, e.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	const puts = 5
	for i := range puts {
		if _, err := clis[0].Put(ctx, fmt.Sprintf("/w/%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	for i, ch := range chans {
		for got := 0; got < puts; {
			select {
			case wr := <-ch:
				got += len(wr.Events)
			case <-ctx.Done():
				t.Fatalf("watch %d: %d of %d events", i, got, puts)
			}
		}
	}
	m1, err := etcdMetrics(ctx, e.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m1[metricWatchEvents]-m0[metricWatchEvents], float64(puts*len(chans)); got != want {
		t.Errorf("%s grew by %g for %d puts to %d watchers, want %g", metricWatchEvents, got, puts, len(chans), want)
	}
}

// TestStepCostSplitsCPU: a step's CPU is split by process: the runners'
// (this process less its settle polls, or the runner processes), the load
// child's, etcd's and the harness's.
func TestStepCostSplitsCPU(t *testing.T) {
	s := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
	m := func(reqs, events float64) map[string]float64 {
		return map[string]float64{metricUnary: reqs, metricWatchEvents: events}
	}
	c0 := costMark{self: s(10), polls: s(1), procs: map[int]time.Duration{7: s(1)}, load: s(2), etcd: s(1), m: m(100, 1000)}
	c1 := costMark{self: s(13), polls: s(1.5), procs: map[int]time.Duration{7: s(2), 8: s(0.5)}, load: s(3), etcd: s(1.5), m: m(150, 3000)}
	noLoad0, noLoad1 := c0, c1
	noLoad0.load, noLoad1.load = -1, -1
	for _, tc := range []struct {
		name   string
		p      Params
		c0, c1 costMark
		want   StepCost
	}{
		{"runners in this process", Params{}, c0, c1,
			StepCost{RunnersCPU: 2.5, HarnessCPU: 0.5, LoadCPU: 1, EtcdCPU: 0.5, ChangeCPU: 3}},
		{"runner processes", Params{Procs: true}, c0, c1,
			StepCost{RunnersCPU: 1.5, HarnessCPU: 3, LoadCPU: 1, EtcdCPU: 0.5, ChangeCPU: 2}},
		{"runner processes, load in this process", Params{Procs: true, InProcessLoad: true}, noLoad0, noLoad1,
			StepCost{RunnersCPU: 1.5, HarnessCPU: 0.5, LoadCPU: 2.5, EtcdCPU: 0.5, ChangeCPU: 2}},
		{"everything in this process", Params{InProcessLoad: true}, noLoad0, noLoad1,
			StepCost{RunnersCPU: 2.5, HarnessCPU: 0.5, EtcdCPU: 0.5, ChangeCPU: 3}},
	} {
		h := &harness{p: tc.p}
		got := h.costBetween(tc.c0, tc.c1, 0)
		got.Requests, got.WatchEvents, got.Txns = 0, 0, 0
		if got != tc.want {
			t.Errorf("%s: cost %+v, want %+v", tc.name, got, tc.want)
		}
	}
	got := (&harness{}).costBetween(c0, c1, 5)
	got.setMoved(20)
	if got.Requests != 50 || got.WatchEvents != 2000 || got.RequestsPerMoved != 2.5 || got.WatchEventsPerMoved != 100 || got.PerRunner != 500 {
		t.Errorf("cost %+v: want 50 requests (2.5 per moved shard), 2000 watch events (100 per moved shard), 500 ms per runner", got)
	}
}

// TestMovedPerStep: a cutover counts for the step under way when it
// completed; none before the first step.
func TestMovedPerStep(t *testing.T) {
	t0 := time.Now()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	steps := []step{{start: at(10)}, {start: at(20)}, {start: at(30)}}
	var wins []cutoverWin
	for _, end := range []int{5, 10, 19, 25, 31, 40} {
		wins = append(wins, cutoverWin{end: at(end)})
	}
	if got, want := movedPerStep(steps, wins), []int{2, 1, 2}; !slices.Equal(got, want) {
		t.Errorf("movedPerStep = %v, want %v", got, want)
	}
}
