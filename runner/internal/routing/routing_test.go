package routing

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
	"github.com/shardhost/shardhost/transport"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const numShards = 4

type counterEntity struct{}

var (
	calls   atomic.Int64
	kind    = entity.NewKind("counter", func(string) *counterEntity { return &counterEntity{} })
	incr    = entity.Method(kind, "incr", func(_ *counterEntity, _ context.Context, n int) (int, error) { calls.Add(1); return n + 1, nil })
	failing = entity.Method(kind, "fail", func(_ *counterEntity, _ context.Context, _ int) (int, error) {
		calls.Add(1)
		return 0, errors.New("boom")
	})
	noopMeta = noop.NewMeterProvider().Meter("test")
)

// dir is a Directory the test steers: the owner of every shard, live
// leases, and whether the runner runs.
type dir struct {
	mu       sync.Mutex
	owner    *storage.Runner
	assignee *storage.Runner // with no owner (nil: none known)
	seen     ViewSeen        // the view revisions Assignee reports
	park     func(context.Context, sharding.ShardID, ViewSeen) bool
	live     map[storage.LeaseID]bool
	stopped  bool
	byAssign bool     // ByAssignment
	learned  []string // what Learned was told: "owner<-refusedBy"
}

func (d *dir) ByAssignment() bool { return d.byAssign }

func (d *dir) Learned(_ sharding.ShardID, owner, refusedBy string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.learned = append(d.learned, owner+"<-"+refusedBy)
}

func (d *dir) Route(sharding.ShardID) (storage.Runner, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.owner == nil {
		return storage.Runner{}, false
	}
	return *d.owner, true
}

func (d *dir) Member(string) (storage.Runner, bool) { return storage.Runner{}, false }

func (d *dir) Assignee(sharding.ShardID) (storage.Runner, ViewSeen, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.owner != nil || d.assignee == nil {
		return storage.Runner{}, ViewSeen{}, false
	}
	return *d.assignee, d.seen, true
}

func (d *dir) Park(ctx context.Context, id sharding.ShardID, seen ViewSeen) bool {
	if d.park == nil {
		return false
	}
	return d.park(ctx, id, seen)
}

func (d *dir) NoRoute(id sharding.ShardID, _ time.Duration) error {
	return &hosting.UndeliveredError{Shard: id, Cause: ErrNoOwner}
}

func (d *dir) NotHere(id sharding.ShardID) error {
	return &hosting.NotOwnerError{Shard: id, OwnerHint: "elsewhere"}
}

func (d *dir) LeaseEndsByDrain(l storage.LeaseID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.live[l]
}

func (d *dir) Running() bool                 { return !d.stopped }
func (d *dir) WaitRun(context.Context) error { return errors.New("not running") }
func (d *dir) ClosedErr() error              { return errors.New("closed") }

type hostEnv struct{}

func (hostEnv) PastDetach() bool { return false }
func (hostEnv) NotHere(id sharding.ShardID) error {
	return &hosting.NotOwnerError{Shard: id}
}

func hostMetrics() *hosting.Metrics {
	m, _ := hosting.NewMetrics(noopMeta, metric.WithAttributes())
	return m
}

// node is one runner's hosting and routing on an in-memory network.
type node struct {
	host   *hosting.Host
	router *Router
	dir    *dir
	net    *transport.Inmem
}

func newNode(t *testing.T, network *transport.InmemNetwork, addr string, epoch storage.Epoch, hostAll bool, maxWaiting int) *node {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	n := &node{dir: &dir{live: map[storage.LeaseID]bool{}}, net: network.Transport(addr)}
	hm := hostMetrics()
	n.host = hosting.New(hosting.Config{RunnerID: addr, NumShards: numShards, DrainTimeout: time.Second, CutoverWaiters: 4,
		PassivationInterval: time.Hour}, hostEnv{}, memory.New(), hm, log)
	if err := n.host.Register(kind); err != nil {
		t.Fatal(err)
	}
	met, _ := NewMetrics(noopMeta, hm.Attrs, hm.Dropped)
	n.router = New(Config{RunnerID: addr, NumShards: numShards, MaxWaitingSends: maxWaiting, MaxMessageSize: 1 << 20},
		n.dir, n.host, n.net, met, log)
	if hostAll {
		ctx, cancel := context.WithCancelCause(context.Background())
		t.Cleanup(func() { cancel(hosting.ErrShutdown) })
		for id := range numShards {
			n.host.Install(n.host.NewShard(hosting.ShardSpec{ID: sharding.ShardID(id), Epoch: epoch, Ctx: ctx, Attachment: context.Background()}))
		}
	}
	if _, err := n.net.Listen(n.router.Receiver()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.net.Close(0) })
	return n
}

func TestResultOlderThanASeenEpochIsWithheldOnlyFromAnEndedLease(t *testing.T) {
	network := transport.NewInmemNetwork()
	a := newNode(t, network, "a:1", 0, false, 10)
	newNode(t, network, "b:1", 5, true, 10) // b hosts every shard at epoch 5
	owner := storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "b", Address: "b:1"}, Lease: 42}
	a.dir.owner = &owner
	a.router.SawEpoch(sharding.ShardOf("x", numShards), 6) // a newer owner was seen

	_, err := incr.Ask(context.Background(), a.router, "x", 1)
	var stale *hosting.StaleResultError
	if !errors.As(err, &stale) || stale.Epoch != 5 || stale.Newer != 6 || !errors.Is(err, hosting.ErrMaybeDelivered) {
		t.Fatalf("result of epoch 5 from an ended lease after epoch 6 was seen: %v, want a withheld *StaleResultError", err)
	}
	a.dir.live[42] = true // a live owner moves a shard only after its drain
	if v, err := incr.Ask(context.Background(), a.router, "x", 1); err != nil || v != 2 {
		t.Fatalf("result of epoch 5 from a live owner = %v, %v; want it accepted", v, err)
	}
}

func TestOnlyFailuresProvingNoHandlerRanAreRetried(t *testing.T) {
	network := transport.NewInmemNetwork()
	a := newNode(t, network, "a:1", 0, false, 10)
	newNode(t, network, "b:1", 1, true, 10)
	done := make(chan struct{})
	go func() {
		time.Sleep(50 * time.Millisecond) // the send waits for an owner meanwhile
		a.dir.mu.Lock()
		a.dir.owner = &storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "b", Address: "b:1"}, Lease: 1}
		a.dir.mu.Unlock()
		a.router.RoutesChanged()
		close(done)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if v, err := incr.Ask(ctx, a.router, "y", 1); err != nil || v != 2 {
		t.Fatalf("ask retried until an owner was known = %v, %v", v, err)
	}
	<-done
	before := calls.Load()
	if _, err := failing.Ask(ctx, a.router, "y", 0); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("handler error = %v, want it returned", err)
	}
	if n := calls.Load() - before; n != 1 {
		t.Fatalf("a failing handler ran %d times, want once (a handler error is never retried)", n)
	}
}

func TestSendsWaitingForAnOwnerAreBounded(t *testing.T) {
	network := transport.NewInmemNetwork()
	a := newNode(t, network, "a:1", 0, false, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	first := make(chan error, 1)
	go func() { _, err := incr.Ask(ctx, a.router, "z", 1); first <- err }()
	for a.router.waiting.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if _, err := incr.Ask(ctx, a.router, "z", 1); !errors.Is(err, ErrTooManyWaiting) {
		t.Errorf("second waiting send = %v, want ErrTooManyWaiting", err)
	}
	if err := <-first; !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrNoOwner) {
		t.Errorf("first send = %v, want its deadline joined with the last reason (no owner)", err)
	}
}

// TestSendWithoutOwnerGoesToTheAssigneeWhichParksIt: a send that knows no
// owner of the shard goes to its assignee b at once; b holds the request
// (Park) until it hosts the shard, then delivers it like any other: one
// request, one run, answered by b — no wait for an owner at the sender.
// The request carries the revisions of a's views that named b (b may wait
// for its own views to reach them).
func TestSendWithoutOwnerGoesToTheAssigneeWhichParksIt(t *testing.T) {
	network := transport.NewInmemNetwork()
	a := newNode(t, network, "a:1", 0, false, 10)
	b := newNode(t, network, "b:1", 0, false, 10) // hosts nothing yet
	a.dir.assignee = &storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "b", Address: "b:1"}, Lease: 2}
	a.dir.seen = ViewSeen{Locks: 1 << 35, Runners: 77}
	parked, install := make(chan struct{}), make(chan struct{})
	var received atomic.Int64
	ctx, cancel := context.WithCancelCause(context.Background())
	t.Cleanup(func() { cancel(hosting.ErrShutdown) })
	b.dir.park = func(_ context.Context, id sharding.ShardID, seen ViewSeen) bool {
		if seen != a.dir.seen {
			t.Errorf("the assignee's request carries views %+v, want the sender's %+v", seen, a.dir.seen)
		}
		received.Add(1)
		close(parked)
		<-install // the acquisition runs
		b.host.Install(b.host.NewShard(hosting.ShardSpec{ID: id, Epoch: 1, Ctx: ctx, Attachment: context.Background()}))
		return true
	}
	before := calls.Load()
	res := make(chan error, 1)
	go func() {
		v, err := incr.Ask(context.Background(), a.router, "p", 1)
		if err == nil && v != 2 {
			err = errors.New("wrong answer")
		}
		res <- err
	}()
	select {
	case <-parked:
	case err := <-res:
		t.Fatalf("the ask ended before the assignee parked it: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the send never reached the assignee (it waits for an owner)")
	}
	if a.router.waiting.Load() != 0 {
		t.Error("the send counts as waiting for an owner while the assignee holds it")
	}
	close(install)
	if err := <-res; err != nil {
		t.Fatalf("ask parked at the assignee = %v, want answered", err)
	}
	if n := received.Load(); n != 1 {
		t.Errorf("the assignee got %d requests, want one", n)
	}
	if n := calls.Load() - before; n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
}

func TestReceiverNeverForwards(t *testing.T) {
	network := transport.NewInmemNetwork()
	b := newNode(t, network, "b:1", 0, false, 10) // hosts nothing
	b.dir.owner = &storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "c", Address: "c:1"}}
	req := &transport.DeliverRequest{Kind: "counter", Method: "incr", Entity: "w", Shard: uint32(sharding.ShardOf("w", numShards)), Payload: []byte("1"), Codec: entity.JSON.Name()}
	resp, written := b.router.Receiver().Deliver(context.Background(), req)
	written()
	if resp.Code != transport.CodeNotOwner || resp.OwnerHint != "elsewhere" {
		t.Fatalf("delivery to a runner not hosting the shard = %v %q (hint %q), want NOT_OWNER with the directory's hint", resp.Code, resp.Message, resp.OwnerHint)
	}
}

func TestWireMappingKeepsTypedErrors(t *testing.T) {
	req := &transport.DeliverRequest{Kind: "k", Method: "m", Entity: "e", Shard: 3}
	for _, c := range []struct {
		err   error
		sent  bool
		retry bool
		check func(error) bool
	}{
		{&hosting.NotOwnerError{Shard: 3, OwnerHint: "b"}, false, true, func(err error) bool {
			var no *hosting.NotOwnerError
			return errors.As(err, &no) && no.OwnerHint == "b" && no.Shard == 3
		}},
		{&hosting.UndeliveredError{Shard: 3, Cause: hosting.ErrDetached}, false, true, func(err error) bool { return errors.Is(err, hosting.ErrDetached) }},
		{&hosting.UndeliveredError{Shard: 3, Cause: hosting.ErrShardMoved}, false, true, func(err error) bool { return errors.Is(err, hosting.ErrShardMoved) }},
		{&hosting.UndeliveredError{Shard: 3, Cause: hosting.ErrShutdown}, false, true, func(err error) bool { return errors.Is(err, hosting.ErrShutdown) }},
		{entity.ErrMailboxFull, false, false, func(err error) bool { return errors.Is(err, entity.ErrMailboxFull) }},
		{&hosting.StaleResultError{Shard: 3, Reason: "late", Cause: hosting.ErrDetached}, true, false, func(err error) bool {
			return errors.Is(err, hosting.ErrMaybeDelivered) && errors.Is(err, hosting.ErrDetached)
		}},
		{&entity.PanicError{Value: "oops"}, true, false, func(err error) bool {
			var pe *entity.PanicError
			return errors.As(err, &pe) && pe.Value == "oops" && pe.Kind == "k"
		}},
		{errors.New(strings.Repeat("x", 10000)), true, false, func(err error) bool {
			var re *RemoteError
			return errors.As(err, &re) && len(re.Message) < 5000 && re.Runner == "b"
		}},
	} {
		resp := ErrorResponse(c.err, c.sent)
		got, retry := ResponseError("b", req, resp)
		if retry != c.retry || got == nil || !c.check(got) {
			t.Errorf("%T %.60v through the wire: %.80v (retry %v), want the same type and causes (retry %v)", c.err, c.err, got, retry, c.retry)
		}
	}
}

// TestRoutingByAssignment: a runner that routes by the assignment (no view
// of every lock) sends to the assignee whatever time its caller has left —
// the assignee is the shard's usual owner, not a last resort — and tells
// its directory who answered as the owner, and the owner a refusing runner
// named.
func TestRoutingByAssignment(t *testing.T) {
	network := transport.NewInmemNetwork()
	a := newNode(t, network, "a:1", 0, false, 10)
	newNode(t, network, "b:1", 3, true, 10) // b hosts every shard
	a.dir.byAssign = true
	a.dir.assignee = &storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "b", Address: "b:1"}, Lease: 2}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond) // below assigneeMinTime
	defer cancel()
	if v, err := incr.Ask(ctx, a.router, "z", 1); err != nil || v != 2 {
		t.Fatalf("ask with %v left, routed by the assignment = %v, %v; want served by the assignee", assigneeMinTime, v, err)
	}

	// A runner that does not own the shard names another: Learned hears it.
	c := newNode(t, network, "c:1", 0, false, 10) // hosts nothing: answers NotOwner "elsewhere"
	_ = c
	a.dir.assignee = &storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "c", Address: "c:1"}, Lease: 3}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	_, _ = incr.Ask(ctx2, a.router, "z", 1)
	a.dir.mu.Lock()
	defer a.dir.mu.Unlock()
	if len(a.dir.learned) < 2 || a.dir.learned[0] != "b<-" || a.dir.learned[1] != "elsewhere<-c" {
		t.Errorf("Learned calls %v, want b's reply (it owns the shard), then the refusal of c naming elsewhere", a.dir.learned)
	}
}

// notOwnerForever answers every request "not the owner", naming itself.
type notOwnerForever struct {
	id    string
	calls atomic.Int64
}

func (h *notOwnerForever) Deliver(_ context.Context, req *transport.DeliverRequest) (*transport.DeliverResponse, func()) {
	h.calls.Add(1)
	return &transport.DeliverResponse{Code: transport.CodeNotOwner, OwnerHint: h.id, Shard: req.Shard}, func() {}
}

func (h *notOwnerForever) Hot(uint32, int) []transport.EntityRef { return nil }

// TestPeerAnsweringNotOwnerForeverCostsBoundedRetries: a runner the
// assignment names that answers "not the owner" forever, naming itself,
// gets attempts paced by the back-off (never a loop) until the caller's
// context ends, and the sender forgets it as a hint.
func TestPeerAnsweringNotOwnerForeverCostsBoundedRetries(t *testing.T) {
	network := transport.NewInmemNetwork()
	a := newNode(t, network, "a:1", 0, false, 10)
	hostile := &notOwnerForever{id: "h"}
	ht := network.Transport("h:1")
	if _, err := ht.Listen(hostile); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ht.Close(0) })
	a.dir.byAssign = true
	a.dir.assignee = &storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "h", Address: "h:1"}, Lease: 9}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := incr.Ask(ctx, a.router, "w", 1)
	var no *hosting.NotOwnerError
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &no) {
		t.Fatalf("ask of a shard whose assignee refuses forever = %v, want the deadline with the last NotOwner", err)
	}
	// The back-off grows to 250 ms: about a dozen attempts in a second.
	if n := hostile.calls.Load(); n < 2 || n > 25 {
		t.Errorf("%d attempts at the refusing runner in 1 s, want a paced few", n)
	}
	a.dir.mu.Lock()
	defer a.dir.mu.Unlock()
	for _, l := range a.dir.learned {
		if l != "h<-h" {
			t.Errorf("Learned %q, want only h naming itself (a hint to forget)", l)
		}
	}
}
