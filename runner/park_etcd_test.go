package runner_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
	"github.com/shardhost/shardhost/transport"
)

// The parking tests share one setup (parkAfterCrash): runners a and x
// and a gateway; runner b crashes (Close, then its lease is revoked), but
// the locks of b's shards stay, under a lease no runner holds — as a
// crashed owner's lock does until it expires — so that the shard's
// acquisition by its new assignee a lasts as long as the test wants. The
// gateway, which knows no live owner of the shard, sends its ask to the
// assignee a, which parks it.

// parkCalls counts the handler runs of parkKind per entity.
type parkCalls struct {
	mu  sync.Mutex
	ran map[string]int
}

func (c *parkCalls) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ran[id]
}

type parkEntity struct {
	id    string
	calls *parkCalls
}

type parkReq struct{}

type parkResp struct{ Runner string }

var (
	parkRuns   = &parkCalls{ran: map[string]int{}}
	parkKind   = entity.NewKind("parked", func(id string) *parkEntity { return &parkEntity{id: id, calls: parkRuns} })
	parkMethod = entity.Method(parkKind, "ask", func(e *parkEntity, ctx context.Context, _ parkReq) (parkResp, error) {
		info, _ := runner.ShardInfoFrom(ctx)
		e.calls.mu.Lock()
		e.calls.ran[e.id]++
		e.calls.mu.Unlock()
		return parkResp{Runner: info.Runner}, nil
	})
)

// answers records what a runner's transport answered, per entity.
type answers struct {
	mu  sync.Mutex
	got map[string][]string // entity -> "CODE hint"
}

func (a *answers) hook(req *transport.DeliverRequest, resp *transport.DeliverResponse) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got[req.Entity] = append(a.got[req.Entity], fmt.Sprintf("%s %s", resp.Code, resp.OwnerHint))
}

func (a *answers) of(id string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.got[id]...)
}

type parkSetup struct {
	c       *cluster
	a, x, g *etcdRunner
	shard   sharding.ShardID
	entity  string
	foreign clientv3.LeaseID // holds the crashed runner's locks
	aSaw    *answers         // what a answered
	aViews  *heldViews       // a's store
}

const parkShards = 8

// parkSetups numbers the setups: each asks an entity of its own.
var parkSetups atomic.Int64

// startParkRunners starts runners a, b (and x with withX) and a gateway on
// a fresh cluster and waits until the runners own every shard; a's
// answers are recorded in aSaw. It returns b, which each setup crashes.
func startParkRunners(t *testing.T, withX bool) (*parkSetup, *etcdRunner) {
	t.Helper()
	c := startEtcdCluster(t)
	register := func(r *runner.Runner) error { return r.Register(parkKind) }
	cfg := func(id string) runner.Config {
		// A retry window longer than any test: a keeps acquiring.
		return runner.Config{ID: id, NumShards: parkShards, ListenAddr: "127.0.0.1:0", AcquireRetryWindow: time.Minute,
			RecoverWindow: 200 * time.Millisecond}
	}
	s := &parkSetup{c: c, aSaw: &answers{got: map[string][]string{}}, aViews: &heldViews{Store: c.store()}}
	aCfg := cfg("a")
	aServes := runner.NewServeObserver(aCfg)
	aCfg.Transport = aServes
	s.a = c.startOn(s.aViews, aCfg, register)
	b := c.startWith(cfg("b"), register)
	rs := []*etcdRunner{s.a, b}
	if withX {
		s.x = c.startWith(cfg("x"), register)
		rs = append(rs, s.x)
	}
	s.g = c.startWith(runner.Config{ID: "gateway", NumShards: parkShards, ClientOnly: true}, register)
	c.waitPartition(rs, parkShards, 30*time.Second)
	aServes.Observe(s.aSaw.hook)
	return s, b
}

// pickShard waits until the gateway assigns one of bShards to a and knows
// no owner of it (and, with aToo, a assigns it to itself too), and makes
// it the setup's shard, with an entity of it no other test asks.
func (s *parkSetup) pickShard(t *testing.T, bShards []sharding.ShardID, aToo bool) {
	t.Helper()
	waitFor(t, 20*time.Second, "a shard of b assigned to a, with no owner in the gateway's view", func() bool {
		aa, ga := s.a.Assignment(), s.g.Assignment()
		for _, id := range bShards {
			if int(id) >= len(ga) || ga[id] != "a" || aToo && (int(id) >= len(aa) || aa[id] != "a") {
				continue
			}
			// No owner known: with a full lock view the lock is under a
			// lease of no runner; without one the gateway routes by the
			// assignment (to a) and knows no lock.
			if o, e := s.g.OwnerOf(id); o == "" || !s.g.Config().FullLockView && o == "a" && e == 0 {
				s.shard = id
				return true
			}
		}
		return false
	})
	s.entity = idFor(s.shard, parkShards, fmt.Sprintf("%s-%d-", t.Name(), parkSetups.Add(1))) // parkRuns is shared
}

// parkAfterCrash crashes b with its locks left under a foreign lease and
// returns a shard of b's that the assignment now gives to a, with an
// unused entity of it; a's acquisition of it lasts until foreign ends.
func parkAfterCrash(t *testing.T, withX bool) *parkSetup {
	t.Helper()
	s, b := startParkRunners(t, withX)
	c := s.c
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// b crashes; its locks move under a lease that no runner holds.
	bLease := clientv3.LeaseID(b.Status().Lease)
	b.stop()
	grant, err := c.direct.Grant(ctx, 120)
	if err != nil {
		t.Fatal(err)
	}
	s.foreign = grant.ID
	t.Cleanup(func() { _, _ = c.direct.Revoke(context.Background(), s.foreign) })
	prefix := "/" + c.ns + "/"
	var bShards []sharding.ShardID
	for id, l := range c.locks() {
		if clientv3.LeaseID(l) != bLease {
			continue
		}
		key := prefix + storage.LockKey(id)
		got, err := c.direct.Get(ctx, key)
		if err != nil || len(got.Kvs) != 1 {
			t.Fatalf("read %s: %v", key, err)
		}
		if _, err := c.direct.Put(ctx, key, string(got.Kvs[0].Value), clientv3.WithLease(s.foreign)); err != nil {
			t.Fatal(err)
		}
		bShards = append(bShards, id)
	}
	if _, err := c.direct.Revoke(ctx, bLease); err != nil {
		t.Fatal(err)
	}
	// The assignment without b gives one of b's shards to a; a acquires
	// it (the lock is held by a lease of no runner) and the gateway knows
	// no owner of it.
	s.pickShard(t, bShards, true)
	return s
}

type parkResult struct {
	resp parkResp
	err  error
}

// ask sends the setup's ask through the gateway, bounded by d.
func (s *parkSetup) ask(t *testing.T, d time.Duration) <-chan parkResult {
	res := make(chan parkResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		defer cancel()
		resp, err := parkMethod.Ask(ctx, s.g, s.entity, parkReq{})
		res <- parkResult{resp, err}
	}()
	return res
}

// waitParked waits until a holds the ask parked.
func (s *parkSetup) waitParked(t *testing.T, res <-chan parkResult) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for s.a.ParkedForTest() == 0 {
		select {
		case r := <-res:
			t.Fatalf("the ask ended before a parked it: %+v", r)
		case <-deadline:
			t.Fatalf("a never parked the gateway's ask (a answered %v)", s.aSaw.of(s.entity))
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// TestAskAfterCrashIsParkedAtTheAssignee: after its owner crashed, a shard
// has no owner the gateway knows of; the gateway's ask goes to the
// assignee a at once, which holds it while it acquires the shard and
// delivers it the moment the shard is installed: one request, answered
// OK by a, run once — no NotOwner answer, no wait for the gateway's watch
// to show a's lock.
func TestAskAfterCrashIsParkedAtTheAssignee(t *testing.T) {
	t.Parallel()
	s := parkAfterCrash(t, false)
	res := s.ask(t, 30*time.Second)
	s.waitParked(t, res)
	if _, err := s.c.direct.Revoke(t.Context(), s.foreign); err != nil { // the crashed lease ends: a acquires
		t.Fatal(err)
	}
	s.servedOnceByA(t, res)
}

// servedOnceByA checks that the ask res waits for was answered by a, which
// answered one request for it (OK: the one it held) and ran it once, and
// that ownership stayed single.
func (s *parkSetup) servedOnceByA(t *testing.T, res <-chan parkResult) {
	t.Helper()
	r := <-res
	if r.err != nil || r.resp.Runner != "a" {
		t.Fatalf("ask = %+v, %v; want answered by a", r.resp, r.err)
	}
	if got := s.aSaw.of(s.entity); len(got) != 1 || got[0] != "OK " {
		t.Errorf("a answered %v, want one OK (the request it held)", got)
	}
	if n := parkRuns.count(s.entity); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
	checkSingleOwner(t, s.c.rec.all())
}

// TestParkedAskIsAnsweredNotOwnerWhenAnotherRunnerTakesTheShard: while a
// holds the ask parked, the shard's lock goes to another live runner, x
// (an acquisition race a lost). a answers NotOwner naming x at once — no
// handler ran on a — and the gateway's retry is served by whoever owns
// the shard then; the handler runs exactly once, on one owner at a time.
func TestParkedAskIsAnsweredNotOwnerWhenAnotherRunnerTakesTheShard(t *testing.T) {
	t.Parallel()
	s := parkAfterCrash(t, true)
	res := s.ask(t, 30*time.Second)
	s.waitParked(t, res)
	// x takes the lock: written under x's lease with x's own lock value,
	// as x's acquire would.
	ctx := t.Context()
	prefix := "/" + s.c.ns + "/"
	var xValue string
	xLease := clientv3.LeaseID(s.x.Status().Lease)
	for id, l := range s.c.locks() {
		if clientv3.LeaseID(l) == xLease {
			got, err := s.c.direct.Get(ctx, prefix+storage.LockKey(id))
			if err != nil || len(got.Kvs) != 1 {
				t.Fatalf("read x's lock %d: %v", id, err)
			}
			xValue = string(got.Kvs[0].Value)
			break
		}
	}
	if xValue == "" {
		t.Fatal("x owns no shard")
	}
	if _, err := s.c.direct.Put(ctx, prefix+storage.LockKey(s.shard), xValue, clientv3.WithLease(xLease)); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("ask = %v; want answered", r.err)
	}
	got := s.aSaw.of(s.entity)
	if len(got) == 0 || got[0] != "NOT_OWNER x" {
		t.Errorf("a answered %v; want NOT_OWNER naming x first (the parked request, not run)", got)
	}
	if n := parkRuns.count(s.entity); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
	checkSingleOwner(t, s.c.rec.all())
}

// TestParkedAskIsNotDeliveredWhenTheAssigneeDetaches: while a holds the
// ask parked, a's lease ends (a detaches). The parked request is answered
// at once — not delivered (no handler ran) — and the gateway's retry is
// served once a has re-attached and acquired the shard.
func TestParkedAskIsNotDeliveredWhenTheAssigneeDetaches(t *testing.T) {
	t.Parallel()
	s := parkAfterCrash(t, false)
	res := s.ask(t, 30*time.Second)
	s.waitParked(t, res)
	if _, err := s.c.direct.Revoke(t.Context(), clientv3.LeaseID(s.a.Status().Lease)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "a answers the parked ask", func() bool { return len(s.aSaw.of(s.entity)) > 0 })
	first := s.aSaw.of(s.entity)[0]
	if first != "UNDELIVERED " && first != "NOT_OWNER " {
		t.Errorf("a answered the parked ask %q after its lease ended; want UNDELIVERED or NOT_OWNER", first)
	}
	if n := parkRuns.count(s.entity); n != 0 {
		t.Errorf("the handler ran %d times before the shard was acquired again, want none", n)
	}
	if _, err := s.c.direct.Revoke(t.Context(), s.foreign); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil || r.resp.Runner != "a" {
		t.Fatalf("ask = %+v, %v; want answered by a after its re-attachment", r.resp, r.err)
	}
	if n := parkRuns.count(s.entity); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
	checkSingleOwner(t, s.c.rec.all())
}

// TestParkedAskNeverRunsAfterItsDeadline: an ask whose deadline ends
// while a holds it parked fails with the deadline, and its handler never
// runs, not even once a installs the shard later; the next ask runs once.
//
// a's deadline for the request is its arrival plus the time the sender
// had left when it sent it (deadlines travel as durations: no clock is
// compared), so it ends after the sender's by the request's transit. On a
// starved machine that transit is long enough for the sender's deadline
// to pass while a still holds the request: the sender then says "maybe
// delivered", and an install before a's own deadline would rightly run
// it. The test waits until a holds nothing parked — a answered the request
// NotOwner at its own deadline — before it lets a acquire the shard.
func TestParkedAskNeverRunsAfterItsDeadline(t *testing.T) {
	t.Parallel()
	s := parkAfterCrash(t, false)
	res := s.ask(t, time.Second)
	s.waitParked(t, res)
	r := <-res
	if !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("ask past its deadline = %+v, %v; want context.DeadlineExceeded", r.resp, r.err)
	}
	if errors.Is(r.err, runner.ErrMaybeDelivered) {
		t.Logf("the sender's deadline passed while a held the request: %v", r.err)
	}
	waitFor(t, 20*time.Second, "a holds no parked request", func() bool { return s.a.ParkedForTest() == 0 })
	if _, err := s.c.direct.Revoke(t.Context(), s.foreign); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "a owns the shard", func() bool {
		_, ok := s.a.Owned()[s.shard]
		return ok
	})
	r = <-s.ask(t, 30*time.Second)
	if r.err != nil || r.resp.Runner != "a" {
		t.Fatalf("next ask = %+v, %v; want answered by a", r.resp, r.err)
	}
	if n := parkRuns.count(s.entity); n != 1 {
		t.Errorf("the handler ran %d times, want once (the second ask only)", n)
	}
}

// lagSetup is runners a and b and a gateway; b has crashed (its lease
// revoked: its locks and record gone) while a's lock and runner watches
// were held, so that the gateway knows b is gone and sends an ask for one
// of b's shards to its assignee a, whose views still show b owning it.
type lagSetup struct {
	*parkSetup
	release func() // lets a's views catch up
}

func lagAfterCrash(t *testing.T) *lagSetup {
	t.Helper()
	ps, b := startParkRunners(t, false)
	s, c := &lagSetup{parkSetup: ps}, ps.c
	bLease := storage.LeaseID(b.Status().Lease)
	var bShards []sharding.ShardID
	for id, l := range c.locks() {
		if l == bLease {
			bShards = append(bShards, id)
		}
	}
	if len(bShards) == 0 {
		t.Fatal("b owns no shard")
	}
	s.release = s.aViews.hold()
	t.Cleanup(s.release) // before the runners stop
	b.stop()
	if _, err := c.direct.Revoke(t.Context(), clientv3.LeaseID(bLease)); err != nil {
		t.Fatal(err)
	}
	s.pickShard(t, bShards, false) // a's views are held: its own assignment is the old one
	if _, ok := s.a.Owned()[s.shard]; ok {
		t.Fatalf("a owns shard %d while its views are held", s.shard)
	}
	return s
}

// TestAssigneeBehindTheSenderWaitsForItsViews: the gateway sends its ask
// to the assignee a because it saw the crashed owner b's lease end; a has
// not seen that yet (its watches lag). a does not refuse the request — it
// holds it until its views reach the revisions the request names, then
// acquires the shard and delivers it: one request, answered OK by a, run
// once. (Answered NotOwner at once, the gateway would wait for its own
// watch to show a's lock, or for its back-off.)
func TestAssigneeBehindTheSenderWaitsForItsViews(t *testing.T) {
	t.Parallel()
	s := lagAfterCrash(t)
	res := s.ask(t, 30*time.Second)
	s.waitParked(t, res)
	if got := s.aSaw.of(s.entity); len(got) != 0 {
		t.Fatalf("a answered %v while its views lagged; want the request held", got)
	}
	s.release()
	s.servedOnceByA(t, res)
}

// TestAssigneeBehindTheSenderWaitsOnlySoLong: an assignee whose views do
// not catch up with the sender's within its bound answers NotOwner — the
// request ran nowhere — rather than holding it until the caller's
// deadline; the ask is served once its views move on.
func TestAssigneeBehindTheSenderWaitsOnlySoLong(t *testing.T) {
	t.Parallel()
	s := lagAfterCrash(t)
	res := s.ask(t, 30*time.Second)
	waitFor(t, 20*time.Second, "a answers the ask while its views are held", func() bool { return len(s.aSaw.of(s.entity)) > 0 })
	if got := s.aSaw.of(s.entity)[0]; !strings.HasPrefix(got, "NOT_OWNER") {
		t.Errorf("a answered %q with its views held; want NOT_OWNER", got)
	}
	if n := parkRuns.count(s.entity); n != 0 {
		t.Errorf("the handler ran %d times before a acquired the shard, want none", n)
	}
	s.release()
	r := <-res
	if r.err != nil || r.resp.Runner != "a" {
		t.Fatalf("ask = %+v, %v; want answered by a once its views caught up", r.resp, r.err)
	}
	if n := parkRuns.count(s.entity); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
	checkSingleOwner(t, s.c.rec.all())
}

// heldViews is an etcd store whose watches of the runners, the shard locks
// and the notices pass no update while held: the views of the runner on it
// lag behind the store's (and other runners').
type heldViews struct {
	*etcd.Store
	held atomic.Pointer[sync.RWMutex]
}

// hold makes the watches wait, before they pass their next update, until
// release is called.
func (h *heldViews) hold() (release func()) {
	m := new(sync.RWMutex)
	m.Lock()
	h.held.Store(m)
	return sync.OnceFunc(func() {
		h.held.Store(nil)
		m.Unlock()
	})
}

func (h *heldViews) Watch(ctx context.Context, ks storage.Keyspace, from storage.Revision) <-chan storage.WatchResponse {
	in := h.Store.Watch(ctx, ks, from)
	if ks != storage.KeyspaceRunners && ks != storage.KeyspaceShards && !strings.HasPrefix(string(ks), string(storage.KeyspaceNotices)+"/") {
		return in
	}
	out := make(chan storage.WatchResponse)
	go func() {
		defer close(out)
		for resp := range in {
			if m := h.held.Load(); m != nil {
				m.RLock()
				m.RUnlock() // waited for the release
			}
			select {
			case out <- resp:
			case <-ctx.Done():
				for range in { // the store closes it once ctx ended
				}
				return
			}
		}
	}()
	return out
}
