package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/runner/runnertest/ownership"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ctl runs one command line and returns its exit status and outputs.
func ctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// ctlJSON runs a command with -json that must succeed and decodes its output.
func ctlJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	code, out, errOut := ctl(t, append(args, "-json")...)
	if code != exitOK {
		t.Fatalf("shardhostctl %v: exit %d\n%s%s", args, code, out, errOut)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("shardhostctl %v: %v\n%s", args, err, out)
	}
}

// node is a runner of the test cluster.
type node struct {
	*runner.Runner
	sub  *runner.Subscription
	evs  chan runner.Event
	done chan error
	mu   sync.Mutex
	all  []runner.Event // every event, for a failed test's report
}

// lastEventsShown is how many of each runner's last events a failed test
// prints.
const lastEventsShown = 15

// startRunner runs a hosting runner on namespace ns of the etcd at endpoint.
func startRunner(t *testing.T, endpoint, ns, id string, shards int) *node {
	t.Helper()
	return startRunnerWith(t, endpoint, ns, runner.Config{ID: id, NumShards: shards})
}

// startRunnerWith is startRunner with more of the configuration (ID and
// NumShards included; a transport, a 3 s lease TTL and a WARN logger are
// added); setup, if given, runs before Run (kinds, workers, singletons).
func startRunnerWith(t *testing.T, endpoint, ns string, cfg runner.Config, setup ...func(*runner.Runner) error) *node {
	t.Helper()
	cli := testenv.NewEtcdClient(t, endpoint)
	store, err := etcd.New(cli, ns, etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.ListenAddr, cfg.LeaseTTL = "127.0.0.1:0", 3*time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	r, err := runner.New(store, cfg)
	for _, f := range setup {
		if err == nil {
			err = f(r)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	n := &node{Runner: r, sub: r.Subscribe(), evs: make(chan runner.Event, 100000), done: make(chan error, 1)}
	testenv.OnFailure(t, func() string {
		n.mu.Lock()
		defer n.mu.Unlock()
		return ownership.LastEvents(n.all, lastEventsShown)
	})
	go func() {
		for ev := range n.sub.Events() {
			n.mu.Lock()
			n.all = append(n.all, ev)
			n.mu.Unlock()
			n.evs <- ev
		}
		close(n.evs)
	}()
	go func() { n.done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Shutdown(ctx)
		<-n.done
		n.sub.Close()
	})
	return n
}

// events drains the events received so far.
func (n *node) events() []runner.Event {
	var out []runner.Event
	for {
		select {
		case ev := <-n.evs:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// outliveTest is the TTL of a lease a test grants and never renews: longer
// than the test can run (its -timeout), so that the records the test wrote
// under it stay, however slowly the machine runs the test.
func outliveTest(t *testing.T) time.Duration {
	if d, ok := t.Deadline(); ok {
		return time.Until(d) + time.Minute
	}
	return time.Hour
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, d, what, cond)
}

// settled reports whether the nodes own every shard once, as the
// assignment they all computed says, each at least one.
func settled(nodes []*node, shards int) bool {
	total := 0
	first := nodes[0].Assignment()
	for _, n := range nodes {
		a := n.Assignment()
		if len(a) != shards || !slices.Equal(a, first) || len(a.ShardsOf(n.ID())) == 0 {
			return false
		}
		owned := n.Owned()
		if len(owned) != len(a.ShardsOf(n.ID())) {
			return false
		}
		for s := range owned {
			if a[s] != n.ID() {
				return false
			}
		}
		total += len(owned)
	}
	return total == shards
}

// TestAgainstRealCluster: status, shards and where agree with what two
// runners on a real etcd own, with the cluster's shard count (a
// non-default one) read from its cluster record, not given on the command
// line; a -shards that differs overrides it with a warning; drain moves a runner's shards away by
// handoff (no shard lost, every move a cutover) and undrain brings them
// back, also across a restart of the drained runner; the guard rail
// refuses draining the last runner.
func TestAgainstRealCluster(t *testing.T) {
	const shards = 32 // not the default 1024: the commands must read it from the cluster record
	srv := testenv.StartEtcd(t)
	ep := srv.Endpoint()
	r1 := startRunner(t, ep, "ctl", "r1", shards)
	r2 := startRunner(t, ep, "ctl", "r2", shards)
	nodes := []*node{r1, r2}
	waitFor(t, 15*time.Second, "two runners owning all shards", func() bool { return settled(nodes, shards) })
	base := []string{"-endpoints", ep, "-namespace", "ctl"} // no -shards

	var st Status
	ctlJSON(t, &st, append(base, "status")...)
	if st.NumShards != shards || st.Strategy != sharding.Default().Name() {
		t.Fatalf("status: %d shards, strategy %q; want the cluster record's %d, %q", st.NumShards, st.Strategy, shards, sharding.Default().Name())
	}
	if st.Owned != shards || st.Unowned != 0 || st.Unknown != 0 || len(st.Runners) != 2 || st.Namespace != "ctl" {
		t.Fatalf("status = %+v, want 2 runners owning all %d shards", st, shards)
	}
	for i, sr := range st.Runners {
		n := nodes[i]
		if sr.ID != n.ID() || sr.State != "active" || sr.Shards != len(n.Owned()) || sr.Incarnation != n.Status().Incarnation ||
			sr.LeaseTTL <= 0 || sr.LeaseTTL > 3 || sr.Lease != fmt.Sprintf("%x", n.Status().Lease) {
			t.Errorf("status runner %d = %+v; runner %s owns %d, lease %x", i, sr, n.ID(), len(n.Owned()), n.Status().Lease)
		}
	}
	code, out, errOut := ctl(t, append(base, "status")...)
	if code != exitOK || !strings.Contains(out, fmt.Sprintf("shards: %d of %d owned, 0 unowned", shards, shards)) ||
		!strings.Contains(out, "r1") || !strings.Contains(out, "r2") || strings.Contains(errOut, "warning") {
		t.Errorf("status text (exit %d):\n%s%s", code, out, errOut)
	}
	// -shards agreeing with the record: silent; disagreeing: it wins, with a warning.
	if code, _, errOut := ctl(t, append(base, "-shards", fmt.Sprint(shards), "status")...); code != exitOK || strings.Contains(errOut, "warning") {
		t.Errorf("status -shards %d (the record's): exit %d, stderr %q; want no warning", shards, code, errOut)
	}
	code, out, errOut = ctl(t, append(base, "-shards", "64", "where", "counter", "user-42")...)
	if want := fmt.Sprintf("shard %d of 64", sharding.ShardOf("user-42", 64)); code != exitOK || !strings.Contains(out, want) ||
		!strings.Contains(errOut, fmt.Sprintf("warning: -shards 64 overrides the cluster record's NumShards %d", shards)) {
		t.Errorf("where with -shards 64: exit %d, %q, stderr %q; want %q and a warning", code, out, errOut, want)
	}

	var rows []ShardRow
	ctlJSON(t, &rows, append(base, "shards", "-owner", "r1")...)
	owned := r1.Owned()
	if len(rows) != len(owned) {
		t.Errorf("shards -owner r1: %d rows, r1 owns %d", len(rows), len(owned))
	}
	for _, row := range rows {
		if e, ok := owned[row.Shard]; !ok || row.Epoch != int64(e) || row.Owner != "r1" || !row.Registered {
			t.Errorf("row %+v; r1 owns it: %v at epoch %d", row, ok, e)
		}
	}
	ctlJSON(t, &rows, append(base, "shards", "-range", "4-7")...)
	if len(rows) != 4 || rows[0].Shard != 4 || rows[3].Shard != 7 {
		t.Errorf("shards -range 4-7 = %+v", rows)
	}

	var w Where
	ctlJSON(t, &w, append(base, "where", "counter", "user-42")...)
	shard := sharding.ShardOf("user-42", shards)
	owner := "r1"
	if _, ok := r2.Owned()[shard]; ok {
		owner = "r2"
	}
	if w.Shard != shard || w.Owner != owner || w.Epoch == 0 || w.Address == "" {
		t.Errorf("where counter user-42 = %+v, want shard %d owned by %s", w, shard, owner)
	}
	if code, out, _ := ctl(t, append(base, "where", "counter", "user-42")...); !strings.Contains(out, fmt.Sprintf("shard %d of %d, owned by %s", shard, shards, owner)) {
		t.Errorf("where text (exit %d): %q", code, out)
	}

	// Drain r1: every shard moves to r2 by handoff, none is lost.
	r1.events()
	r2.events()
	code, out, errOut = ctl(t, append(base, "drain", "r1", "-wait", "-wait-timeout", "30s", "-reason", "test")...)
	if code != exitOK || !strings.Contains(out, "owns no shard") {
		t.Fatalf("drain r1 -wait: exit %d\n%s%s", code, out, errOut)
	}
	waitFor(t, 10*time.Second, "r2 owning every shard", func() bool { return len(r2.Owned()) == shards && len(r1.Owned()) == 0 })
	cutovers := 0
	for _, ev := range append(r1.events(), r2.events()...) {
		switch e := ev.(type) {
		case runner.ShardLost:
			t.Errorf("shard %d lost (%v) during the drain, want a handoff", e.Shard, e.Cause)
		case runner.HandoffPhase:
			if e.Phase == runner.PhaseCutover && e.Runner == "r2" && e.From == "r1" {
				cutovers++
			}
		}
	}
	if cutovers != len(owned) {
		t.Errorf("%d cutovers r1 -> r2 reported by r2, want one per shard r1 owned (%d)", cutovers, len(owned))
	}
	ctlJSON(t, &st, append(base, "status")...)
	if st.Runners[0].State != "draining" || !st.Runners[0].DrainReq || st.Runners[0].Shards != 0 || st.Runners[0].Weight != 1 ||
		!slices.Equal(st.Drains, []string{"r1"}) {
		t.Errorf("status after drain = %+v, drains %v; want r1 draining with 0 shards, weight kept", st.Runners[0], st.Drains)
	}
	if code, out, _ := ctl(t, append(base, "drain", "r1")...); code != exitOK || !strings.Contains(out, "already requested") {
		t.Errorf("second drain: exit %d, %q", code, out)
	}
	if code, _, errOut := ctl(t, append(base, "drain", "r2")...); code != exitFail || !strings.Contains(errOut, "last runner") {
		t.Errorf("draining the last runner: exit %d, %q; want a refusal", code, errOut)
	}

	// The request outlives the process: r1 restarted registers drained.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	if err := r1.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	r1 = startRunner(t, ep, "ctl", "r1", shards)
	nodes = []*node{r1, r2}
	waitFor(t, 15*time.Second, "the restarted r1 drained", func() bool {
		var s Status
		ctlJSON(t, &s, append(base, "status")...)
		return len(s.Runners) == 2 && s.Runners[0].Incarnation == r1.Status().Incarnation && s.Runners[0].State == "draining" &&
			len(r1.Owned()) == 0 && len(r2.Owned()) == shards
	})

	// Undrain: r1 takes shards again.
	if code, out, errOut := ctl(t, append(base, "undrain", "r1")...); code != exitOK || !strings.Contains(out, "withdrawn") {
		t.Fatalf("undrain r1: exit %d\n%s%s", code, out, errOut)
	}
	waitFor(t, 15*time.Second, "r1 owning shards again", func() bool { return settled(nodes, shards) && len(r1.Owned()) > 0 })
	if code, out, _ := ctl(t, append(base, "undrain", "r1")...); code != exitOK || !strings.Contains(out, "had no drain request") {
		t.Errorf("second undrain: exit %d, %q", code, out)
	}
	// A -shards smaller than the cluster's is caught.
	if code, _, errOut := ctl(t, append(base, "-shards", "8", "status")...); code != exitUsage || !strings.Contains(errOut, "-shards") {
		t.Errorf("status with -shards 8: exit %d, %q", code, errOut)
	}
}

// TestDrainUnregistered: a runner that is not registered can be drained
// ahead (it will start drained); status lists the request; undrain
// withdraws it once.
func TestDrainUnregistered(t *testing.T) {
	srv := testenv.StartEtcd(t)
	cli := srv.Client(t)
	s, _ := etcd.New(cli, "ahead", etcd.Config{})
	l, err := s.Grant(t.Context(), outliveTest(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutRunner(t.Context(), l.ID, storage.RunnerRecord{ID: "r1", Weight: 1, Incarnation: "i", Started: time.Now()}); err != nil {
		t.Fatal(err)
	}
	base := []string{"-endpoints", srv.Endpoint(), "-namespace", "ahead"}
	code, out, errOut := ctl(t, append(base, "drain", "r9", "-wait")...)
	if code != exitOK || !strings.Contains(out, "will start drained") {
		t.Errorf("drain of an unregistered runner: exit %d, %q %q", code, out, errOut)
	}
	code, out, _ = ctl(t, append(base, "status")...)
	if code != exitOK || !strings.Contains(out, "drain requested for r9 (not registered") {
		t.Errorf("status with a request for r9 (exit %d):\n%s", code, out)
	}
	if code, out, _ := ctl(t, append(base, "undrain", "r9")...); code != exitOK || !strings.Contains(out, "withdrawn") {
		t.Errorf("undrain r9: exit %d, %q", code, out)
	}
	if code, out, _ := ctl(t, append(base, "undrain", "r9")...); code != exitOK || !strings.Contains(out, "had no drain request") {
		t.Errorf("second undrain r9: exit %d, %q", code, out)
	}
	if code, _, _ := ctl(t, append(base, "drain", "a/b")...); code != exitUsage {
		t.Errorf("drain of an invalid ID: exit %d, want %d", code, exitUsage)
	}
}

// TestHelpExitsZero: asking for help is not a mistake: usage on stdout,
// exit 0, for the program and for a command; a wrong flag still exits 2
// with the usage on stderr.
func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"status", "-help"}, {"drain", "--help"}} {
		code, out, errOut := ctl(t, args...)
		if code != exitOK || !strings.Contains(out, "usage: shardhostctl") || !strings.Contains(out, "-endpoints") || errOut != "" {
			t.Errorf("shardhostctl %v: exit %d, stdout %q, stderr %q; want 0 and the usage on stdout", args, code, out, errOut)
		}
	}
	if _, out, _ := ctl(t, "drain", "-h"); !strings.Contains(out, "-wait-timeout") {
		t.Errorf("drain -h does not list drain's own flags:\n%s", out)
	}
	code, out, errOut := ctl(t, "--frobnicate")
	if code != exitUsage || out != "" || !strings.Contains(errOut, "usage: shardhostctl") {
		t.Errorf("shardhostctl --frobnicate: exit %d, stdout %q, stderr %q; want 2 and the usage on stderr", code, out, errOut)
	}
}

// TestErrors: unreachable etcd, empty or ambiguous namespaces and usage
// errors each end with a message saying what to do.
func TestErrors(t *testing.T) {
	dead := testenv.FreeAddr(t)
	code, _, errOut := ctl(t, "-endpoints", dead, "-timeout", "500ms", "status")
	if code != exitFail || !strings.Contains(errOut, "cannot reach etcd at "+dead) || !strings.Contains(errOut, "-endpoints") {
		t.Errorf("unreachable etcd: exit %d, %q", code, errOut)
	}

	srv := testenv.StartEtcd(t)
	ep := srv.Endpoint()
	code, _, errOut = ctl(t, "-endpoints", ep, "status")
	if code != exitFail || !strings.Contains(errOut, "no shardhost namespace") {
		t.Errorf("no namespace in etcd: exit %d, %q", code, errOut)
	}
	cli := srv.Client(t)
	for _, ns := range []string{"one", "two"} {
		s, _ := etcd.New(cli, ns, etcd.Config{})
		l, err := s.Grant(t.Context(), outliveTest(t))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutRunner(t.Context(), l.ID, storage.RunnerRecord{ID: "r-" + ns, Weight: 1, Incarnation: "i"}); err != nil {
			t.Fatal(err)
		}
		if ns == "one" {
			code, out, errOut := ctl(t, "-endpoints", ep, "status")
			if code != exitOK || !strings.Contains(errOut, `namespace "one"`) || !strings.Contains(out, "r-one") {
				t.Errorf("the only namespace is picked: exit %d, %q, %q", code, out, errOut)
			}
		}
	}
	code, _, errOut = ctl(t, "-endpoints", ep, "status")
	if code != exitFail || !strings.Contains(errOut, "several shardhost namespaces (one, two)") {
		t.Errorf("two namespaces, none chosen: exit %d, %q", code, errOut)
	}
	code, _, errOut = ctl(t, "-endpoints", ep, "-namespace", "nothing", "status")
	if code != exitFail || !strings.Contains(errOut, `namespace "nothing" is empty`) || !strings.Contains(errOut, "one, two") {
		t.Errorf("empty namespace: exit %d, %q", code, errOut)
	}
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"drain"},
		{"where", "counter"},
		{"-namespace", "one", "shards", "-range", "9-3"},
		{"-shards", "0", "status"},
	} {
		if code, _, errOut := ctl(t, append([]string{"-endpoints", ep}, args...)...); code != exitUsage {
			t.Errorf("shardhostctl %v: exit %d (%q), want %d", args, code, errOut, exitUsage)
		}
	}
}
