package runner_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
	"github.com/shardhost/shardhost/transport"
)

// The chat room of the README's newcomer: a room fans posts out to the
// inboxes of its members, which may live on another runner.

type inbox struct {
	id  string
	log *mailLog
}

type mailLog struct {
	mu   sync.Mutex
	got  map[string][]string // inbox -> texts
	errs []error             // outcomes of the room's asynchronous sends
	sent []string
}

func (l *mailLog) texts(id string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.got[id])
}

func (l *mailLog) outcomes() ([]string, []error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.sent), slices.Clone(l.errs)
}

type postReq struct {
	To   string
	Text string
}

type pingReq struct{}

func (b *inbox) Deliver(_ context.Context, r postReq) error {
	b.log.mu.Lock()
	b.log.got[b.id] = append(b.log.got[b.id], r.Text)
	b.log.mu.Unlock()
	return nil
}

type room struct{ log *mailLog }

// PostSync tells the member's inbox and waits for it to be accepted.
func (rm *room) PostSync(ctx context.Context, r postReq) error {
	s, ok := runner.SenderFrom(ctx)
	if !ok {
		return errors.New("no sender in the handler's context")
	}
	return deliver.Tell(ctx, s, r.To, r)
}

// PostAsync tells the member's inbox without waiting; the outcome is
// recorded when it is known.
func (rm *room) PostAsync(ctx context.Context, r postReq) error {
	s, ok := runner.SenderFrom(ctx)
	if !ok {
		return errors.New("no sender in the handler's context")
	}
	deliver.TellAsync(s, r.To, r, time.Minute, func(err error) {
		rm.log.mu.Lock()
		rm.log.sent, rm.log.errs = append(rm.log.sent, r.Text), append(rm.log.errs, err)
		rm.log.mu.Unlock()
	})
	return nil
}

// Relay asks the member's inbox count through the sender of its context.
func (rm *room) Relay(ctx context.Context, r postReq) (string, error) {
	s, ok := runner.SenderFrom(ctx)
	if !ok {
		return "", errors.New("no sender in the handler's context")
	}
	resp, err := whereIs.Ask(ctx, s, r.To, pingReq{})
	return resp, err
}

func (rm *room) Ping(context.Context, pingReq) (string, error) { return "pong", nil }

func (b *inbox) Where(ctx context.Context, _ pingReq) (string, error) {
	info, _ := runner.ShardInfoFrom(ctx)
	return info.Runner, nil
}

var (
	mail      = &mailLog{got: map[string][]string{}}
	inboxKind = entity.NewKind("inbox", func(id string) *inbox { return &inbox{id: id, log: mail} })
	deliver   = entity.Signal(inboxKind, "deliver", (*inbox).Deliver)
	whereIs   = entity.Method(inboxKind, "where", (*inbox).Where)
	roomKind  = entity.NewKind("room", func(id string) *room { return &room{log: mail} })
	postSync  = entity.Signal(roomKind, "post-sync", (*room).PostSync)
	postAsync = entity.Signal(roomKind, "post-async", (*room).PostAsync)
	relay     = entity.Method(roomKind, "relay", (*room).Relay)
	ping      = entity.Method(roomKind, "ping", (*room).Ping)
)

// chatCluster starts runners a and b on the in-memory store and transport
// (inside a synctest bubble), both hosting rooms and inboxes, and returns
// them once they own an exact partition of n shards.
func chatCluster(t *testing.T, n int) (a, b *started) {
	t.Helper()
	mail.mu.Lock()
	mail.got, mail.sent, mail.errs = map[string][]string{}, nil, nil // the kinds are package-level: a fresh log per test
	mail.mu.Unlock()
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	net := transport.NewInmemNetwork()
	cfg := func(id string) runner.Config {
		return runner.Config{ID: id, NumShards: n, Transport: net.Transport(id + ":7100")}
	}
	a, b = start(t, c, nil, cfg("a")), start(t, c, nil, cfg("b"))
	for _, r := range []*started{a, b} {
		if err := r.Register(inboxKind); err != nil {
			t.Fatal(err)
		}
		if err := r.Register(roomKind); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "a and b own all", func() bool { ok, _ := partitionOK([]*started{a, b}, n); return ok })
	return a, b
}

// ownedBy returns an entity ID (prefix + number) whose shard r owns.
func ownedBy(r *started, n int, prefix string) string {
	owned := r.Owned()
	for s := range sharding.ShardID(n) {
		if _, ok := owned[s]; ok {
			return idFor(s, n, prefix)
		}
	}
	panic(r.ID() + " owns nothing")
}

// TestHandlersSendWithTheSenderOfTheirContext: a handler finds the runner
// hosting it in its context (no global) and asks entities on its own
// runner and on another one with it; outside a handler there is none.
func TestHandlersSendWithTheSenderOfTheirContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 16
		a, b := chatCluster(t, n)
		rm := ownedBy(a, n, "room-")
		for _, owner := range []*started{a, b} {
			got, err := relay.Ask(t.Context(), b, rm, postReq{To: ownedBy(owner, n, "inbox-")})
			if err != nil || got != owner.ID() {
				t.Errorf("room on a asking an inbox on %s: %q, %v; want answered by %s", owner.ID(), got, err, owner.ID())
			}
		}
		if s, ok := runner.SenderFrom(t.Context()); ok || s != nil {
			t.Errorf("SenderFrom(a test's context) = %v, %v; want none", s, ok)
		}
	})
}

// TestAsyncSendDoesNotHoldTheMailboxDuringFailover: while the runner
// owning an inbox has crashed and its lease has not expired, a room whose
// handler tells that inbox synchronously holds its own mailbox until the
// failover ends (about the lease TTL), as runner's documentation says; a
// room that tells it with TellAsync answers its next message at once, and
// its message still reaches the inbox after the failover, with the
// outcome reported.
func TestAsyncSendDoesNotHoldTheMailboxDuringFailover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 16
		a, b := chatCluster(t, n)
		to := ownedBy(b, n, "inbox-")
		syncRoom, asyncRoom := ownedBy(a, n, "sync-room-"), ownedBy(a, n, "async-room-")
		ctx := t.Context()
		if err := deliver.Tell(ctx, a, to, postReq{Text: "before"}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the inbox on b handling a first message", func() bool { return len(mail.texts(to)) == 1 })
		b.Close() // a crash: its locks stay until its lease expires
		crashed := time.Now()

		if err := postAsync.Tell(ctx, a, asyncRoom, postReq{To: to, Text: "async"}); err != nil {
			t.Fatal(err)
		}
		if _, err := ping.Ask(ctx, a, asyncRoom, pingReq{}); err != nil {
			t.Fatal(err)
		}
		if held := time.Since(crashed); held > 100*time.Millisecond {
			t.Errorf("the room that sent asynchronously answered %v after the crash, want at once", held)
		}

		if err := postSync.Tell(ctx, a, syncRoom, postReq{To: to, Text: "sync"}); err != nil {
			t.Fatal(err)
		}
		if _, err := ping.Ask(ctx, a, syncRoom, pingReq{}); err != nil {
			t.Fatal(err)
		}
		held := time.Since(crashed)
		if ttl := b.Config().LeaseTTL; held < ttl/2 {
			t.Errorf("the room that sent synchronously answered %v after the crash, want it held until the failover (lease TTL %v)", held, ttl)
		}
		t.Logf("synchronous send held the room's mailbox %v after the crash (lease TTL %v)", held, b.Config().LeaseTTL)

		waitFor(t, time.Minute, "both messages in the inbox", func() bool { return len(mail.texts(to)) >= 3 })
		if got := mail.texts(to); !slices.Contains(got, "async") || !slices.Contains(got, "sync") {
			t.Errorf("inbox got %q, want both", got)
		}
		sent, errs := mail.outcomes()
		if !slices.Equal(sent, []string{"async"}) || errs[0] != nil {
			t.Errorf("asynchronous outcomes %q %v, want async delivered", sent, errs)
		}
	})
}

// TestAsyncSendsAreBoundedAndEndWithTheRunner: beyond MaxAsyncSends a
// send is refused at once (ErrTooManyAsyncSends, reported before SendAsync
// returns); a send in flight — waiting for an owner that does not come —
// when the runner closes is cancelled and reported, and Close returns
// after its report; after that, sends are refused with ErrClosed.
func TestAsyncSendsAreBoundedAndEndWithTheRunner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		r := start(t, c, nil, runner.Config{ID: "gw", NumShards: 8, ClientOnly: true, MaxAsyncSends: 1})
		if err := r.Register(inboxKind); err != nil {
			t.Fatal(err)
		}
		<-r.Ready()
		first := make(chan error, 1)
		deliver.TellAsync(r, "x", postReq{}, time.Hour, func(err error) { first <- err }) // no runner hosts shards: it waits
		second := make(chan error, 1)
		deliver.TellAsync(r, "y", postReq{}, time.Hour, func(err error) { second <- err })
		select {
		case err := <-second:
			if !errors.Is(err, runner.ErrTooManyAsyncSends) {
				t.Errorf("second send with MaxAsyncSends 1: %v, want ErrTooManyAsyncSends", err)
			}
		default:
			t.Error("the refused send was not reported before TellAsync returned")
		}
		time.Sleep(time.Minute)
		select {
		case err := <-first:
			t.Fatalf("the send waiting for an owner ended within a minute of its hour: %v", err)
		default:
		}
		r.Close()
		select {
		case err := <-first:
			if err == nil {
				t.Error("a send cancelled by Close reported no error")
			}
		default:
			t.Error("Close returned before the send in flight reported its end")
		}
		late := make(chan error, 1)
		deliver.TellAsync(r, "z", postReq{}, time.Second, func(err error) { late <- err })
		if err := <-late; !errors.Is(err, runner.ErrClosed) {
			t.Errorf("send after Close: %v, want ErrClosed", err)
		}
	})
}
