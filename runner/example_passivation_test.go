package runner_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

// Session is state that ends with disuse: a session nobody touched for its
// kind's IdleAfter is over, but one evicted under memory pressure is not.
type Session struct {
	Views int
	notes chan<- string // what Release did, for the example's output
}

type ViewReq struct{}

func (s *Session) View(_ context.Context, _ ViewReq) (int, error) { s.Views++; return s.Views, nil }

// Activate restores the session's checkpoint, if any.
func (s *Session) Activate(ctx context.Context, info entity.ActivateInfo) error {
	data, ok, err := info.Restore(ctx)
	if err != nil || !ok {
		return err
	}
	_, err = fmt.Sscan(string(data), &s.Views)
	return err
}

// Release deletes the session's state when it expired idle, and keeps it
// for every other reason: eviction (the resident cap), a shard move, a
// shutdown. Both passivations match runner.ErrPassivated; only
// runner.ErrIdleExpired means that nobody used the session for IdleAfter.
func (s *Session) Release(ctx context.Context, info entity.ReleaseInfo) error {
	if errors.Is(info.Reason, runner.ErrIdleExpired) {
		s.notes <- info.Entity + ": idle, state deleted"
		return info.DeleteCheckpoint(ctx)
	}
	s.notes <- fmt.Sprintf("%s: %v; state kept (views=%d)", info.Entity, info.Reason, s.Views)
	return info.Checkpoint(ctx, fmt.Append(nil, s.Views))
}

// Idle expiry and eviction both passivate an entity; the Reason of its
// Release hook tells them apart, so a session deletes its state when it
// expires idle and keeps it when it is evicted.
func ExampleErrIdleExpired() {
	notes := make(chan string, 16)
	SessionKind := entity.NewKind("session", func(id string) *Session { return &Session{notes: notes} },
		entity.IdleAfter(2*time.Second))
	View := entity.Method(SessionKind, "view", (*Session).View)

	store := memory.New()
	defer store.Cluster().Close()
	r, err := runner.New(store, runner.Config{ID: "runner-1", NumShards: 8,
		MaxResidentEntities: 1, PassivationInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	if err := r.Register(SessionKind); err != nil {
		panic(err)
	}
	go r.Run(context.Background())
	defer r.Shutdown(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// An entity counts as used when its handler has returned, a moment
	// after its answer: the pauses let each handler return, so that the
	// least recently used entity is the one asked first.
	used := func() { time.Sleep(250 * time.Millisecond) }
	_, _ = View.Ask(ctx, r, "alice", ViewReq{})
	_, _ = View.Ask(ctx, r, "alice", ViewReq{})
	used()
	_, _ = View.Ask(ctx, r, "bob", ViewReq{}) // a second resident: alice is evicted
	fmt.Println(<-notes)
	used()
	n, _ := View.Ask(ctx, r, "alice", ViewReq{}) // alice restored; bob evicted in turn
	fmt.Println("alice views:", n)
	fmt.Println(<-notes)
	fmt.Println(<-notes) // nobody asks for alice for IdleAfter: she expires
	n, _ = View.Ask(ctx, r, "alice", ViewReq{})
	fmt.Println("alice views:", n)
	// Output:
	// alice: runner: entity passivated: evicted (MaxResidentEntities exceeded); state kept (views=2)
	// alice views: 3
	// bob: runner: entity passivated: evicted (MaxResidentEntities exceeded); state kept (views=1)
	// alice: idle, state deleted
	// alice views: 1
}
