package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
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
