package runner_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/shardhost/shardhost/internal/testenv"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// twinEnv is a remembered kind (a device twin: always on) and an ordinary
// one, recording every instance's life from its own hooks.
type twinEnv struct {
	mu    sync.Mutex
	lives []twinLife
	// failNext: Activate fails (an error, then a panic, alternating) this
	// many more times for an entity.
	failNext map[string]int
	attempts map[string][]time.Time // Activate calls, by entity

	twin  *entity.Kind[twin]
	plain *entity.Kind[twin]
	ping  *entity.MethodRef[twin, string, string]
	pingP *entity.MethodRef[twin, string, string]
	boom  *entity.SignalRef[twin, string]
	drop  *entity.MethodRef[twin, string, string]
	adopt *entity.MethodRef[twin, string, string] // remembers the entity its request names
}

type twinLife struct {
	kind, id, runner string
	shard            sharding.ShardID
	epoch            storage.Epoch
	reason           entity.ActivateReason
	start, end       time.Time // end zero while it lives
	cause            error     // Release's reason, or the shard context's cause
}

type twin struct {
	env  *twinEnv
	kind string
	id   string
	life int
}

func newTwinEnv() *twinEnv {
	env := &twinEnv{failNext: map[string]int{}, attempts: map[string][]time.Time{}}
	env.twin = entity.NewKind("twin", func(id string) *twin { return &twin{env: env, kind: "twin", id: id} },
		entity.Remembered(), entity.IdleAfter(2*time.Second))
	env.plain = entity.NewKind("plain", func(id string) *twin { return &twin{env: env, kind: "plain", id: id} },
		entity.IdleAfter(2*time.Second))
	ping := func(w *twin, ctx context.Context, _ string) (string, error) {
		info, _ := runner.ShardInfoFrom(ctx)
		return info.Runner, nil
	}
	env.ping = entity.Method(env.twin, "Ping", ping)
	env.pingP = entity.Method(env.plain, "Ping", ping)
	env.boom = entity.Signal(env.twin, "Boom", func(w *twin, ctx context.Context, _ string) error {
		w.env.end(w.life, errors.New("panicked")) // the instance is discarded
		panic("boom")
	})
	env.drop = entity.Method(env.twin, "Forget", func(w *twin, ctx context.Context, _ string) (string, error) {
		return "", entity.Forget(ctx)
	})
	env.adopt = entity.Method(env.twin, "Adopt", func(w *twin, ctx context.Context, id string) (string, error) {
		s, _ := runner.SenderFrom(ctx)
		return "", entity.Remember(ctx, s, env.twin, id)
	})
	return env
}

func (w *twin) Activate(ctx context.Context, info entity.ActivateInfo) error {
	env := w.env
	env.mu.Lock()
	env.attempts[w.id] = append(env.attempts[w.id], time.Now())
	if n := env.failNext[w.id]; n > 0 {
		env.failNext[w.id] = n - 1
		env.mu.Unlock()
		if n%2 == 0 {
			panic("cannot start")
		}
		return errors.New("cannot start")
	}
	si, _ := runner.ShardInfoFrom(ctx)
	w.life = len(env.lives)
	env.lives = append(env.lives, twinLife{kind: w.kind, id: w.id, runner: si.Runner, shard: info.Shard, epoch: storage.Epoch(info.Epoch), reason: info.Reason, start: time.Now()})
	i := w.life
	env.mu.Unlock()
	go func() { // the shard's context ends with the ownership (a crash, a detach)
		<-ctx.Done()
		env.end(i, context.Cause(ctx))
	}()
	return nil
}

func (w *twin) Release(ctx context.Context, info entity.ReleaseInfo) error {
	w.env.end(w.life, info.Reason)
	return nil
}

func (env *twinEnv) end(i int, cause error) {
	env.mu.Lock()
	defer env.mu.Unlock()
	if env.lives[i].end.IsZero() {
		env.lives[i].end, env.lives[i].cause = time.Now(), cause
	}
}

// live returns the runners where entity kind/id lives now.
func (env *twinEnv) live(kind, id string) []string {
	env.mu.Lock()
	defer env.mu.Unlock()
	var out []string
	for _, l := range env.lives {
		if l.kind == kind && l.id == id && l.end.IsZero() {
			out = append(out, l.runner)
		}
	}
	return out
}

// overlaps returns two lives of one entity on different runners at once.
func (env *twinEnv) overlaps() []string {
	env.mu.Lock()
	defer env.mu.Unlock()
	far := time.Now().Add(time.Hour)
	endOf := func(l twinLife) time.Time {
		if l.end.IsZero() {
			return far
		}
		return l.end
	}
	var out []string
	for i, a := range env.lives {
		for _, b := range env.lives[i+1:] {
			if a.kind == b.kind && a.id == b.id && a.runner != b.runner && a.start.Before(endOf(b)) && b.start.Before(endOf(a)) {
				out = append(out, fmt.Sprintf("%s/%s on %s [%v, %v] and %s [%v, %v]", a.kind, a.id, a.runner, a.start, a.end, b.runner, b.start, b.end))
			}
		}
	}
	return out
}

// passivated counts the lives of kind that ended by passivation.
func (env *twinEnv) passivated(kind string) int {
	env.mu.Lock()
	defer env.mu.Unlock()
	n := 0
	for _, l := range env.lives {
		if l.kind == kind && errors.Is(l.cause, runner.ErrPassivated) {
			n++
		}
	}
	return n
}

func (env *twinEnv) register(t *testing.T, r *runner.Runner) {
	t.Helper()
	if err := r.Register(env.twin, env.plain); err != nil {
		t.Fatal(err)
	}
}

// markers reads the remembered markers of every shard: entity -> revision.
func markers(t *testing.T, st storage.ShardStates, n int) map[string]storage.Revision {
	t.Helper()
	ids := make([]sharding.ShardID, n)
	for i := range ids {
		ids[i] = sharding.ShardID(i)
	}
	sts, err := st.ReadShardStates(t.Context(), ids)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]storage.Revision{}
	for _, s := range sts {
		for _, m := range s.Remembered {
			out[m.Entity.ID] = m.Revision
		}
	}
	return out
}

// TestRememberedEntitiesRunWithoutMessagesWhereverTheirShardGoes: an
// entity of a remembered kind, once activated, is recorded once (no write
// for later messages), is never passivated, and runs again without any
// message on its shard's new owner after a planned move (a join, a
// graceful shutdown) and after a crash — never on two runners at once. An
// ordinary kind is still passivated. A forgotten entity is passivated and
// not activated again after a move.
func TestRememberedEntitiesRunWithoutMessagesWhereverTheirShardGoes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newTwinEnv()
		rc := newReminderCluster(t, newAlarmEnv(), 8)
		rc.cfg.PassivationInterval = 200 * time.Millisecond
		start := func(id string) *started {
			cfg := rc.cfg
			cfg.ID, cfg.Transport = id, rc.net.Transport(id+":7100")
			s := start(t, rc.c, rc.rec, cfg)
			env.register(t, s.Runner)
			return s
		}
		a := start("a")
		rc.converge(a)
		const n = 40
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprint("t", i)
			if _, err := env.ping.Ask(t.Context(), a, ids[i], ""); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := env.pingP.Ask(t.Context(), a, "p0", ""); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "the markers written", func() bool { return len(markers(t, a.store, 8)) == n })
		before := markers(t, a.store, 8)
		for range 5 {
			for _, id := range ids {
				if _, err := env.ping.Ask(t.Context(), a, id, ""); err != nil {
					t.Fatal(err)
				}
			}
		}
		// t0 is done: forgotten, it is passivated like any entity.
		if _, err := env.drop.Ask(t.Context(), a, "t0", ""); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second) // > IdleAfter + PassivationInterval
		after := markers(t, a.store, 8)
		for id, rev := range before {
			if id == "t0" {
				continue
			}
			if after[id] != rev {
				t.Errorf("marker of %s rewritten (revision %d -> %d): a write per message", id, rev, after[id])
			}
		}
		if _, ok := after["t0"]; ok {
			t.Error("t0's marker survived Forget")
		}
		if got := env.passivated("plain"); got != 1 {
			t.Errorf("the ordinary entity was passivated %d times, want 1", got)
		}
		if got := env.passivated("twin"); got != 1 {
			t.Errorf("%d remembered entities passivated, want 1 (t0, forgotten)", got)
		}
		if got := a.Status().Remembered; got != n-1 {
			t.Errorf("RememberedCount %d, want %d", got, n-1)
		}

		checkLive := func(rs ...*started) {
			t.Helper()
			waitFor(t, 20*time.Second, "every remembered entity live on its owner", func() bool {
				for _, id := range ids[1:] {
					l := env.live("twin", id)
					if len(l) != 1 || l[0] != ownerOf(rs, env.twin, id, 8) {
						return false
					}
				}
				return true
			})
			if l := env.live("twin", "t0"); len(l) != 0 {
				t.Errorf("forgotten t0 lives on %v", l)
			}
		}
		b := start("b")
		rc.converge(a, b)
		checkLive(a, b)
		c := start("c")
		rc.converge(a, b, c)
		checkLive(a, b, c)
		sctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		if err := b.Shutdown(sctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		rc.converge(a, c)
		checkLive(a, c)
		c.Close() // a crash: a takes c's shards after the lease TTL
		rc.converge(a)
		checkLive(a)
		if o := env.overlaps(); len(o) > 0 {
			t.Fatalf("one entity on two runners at once:\n%s", strings.Join(o, "\n"))
		}
		env.mu.Lock()
		moved := 0
		for _, l := range env.lives {
			if l.runner != "a" && l.reason == entity.ActivateRemembered {
				moved++
			}
		}
		env.mu.Unlock()
		if moved == 0 {
			t.Error("no remembered entity was activated without a message away from a")
		}
	})
}

// ownerOf returns the runner among rs owning the shard of kind/id.
func ownerOf[E any](rs []*started, _ *entity.Kind[E], id string, n int) string {
	shard := sharding.ShardOf(id, n)
	for _, r := range rs {
		if _, ok := r.Owned()[shard]; ok {
			return r.ID()
		}
	}
	return ""
}

// TestRememberedEntityThatFailsRestartsWithBackoff: a remembered entity
// whose instance panics is activated again without a message; when its
// Activate keeps failing (errors and panics) it is retried after a
// growing back-off, never in a loop, until it starts.
func TestRememberedEntityThatFailsRestartsWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newTwinEnv()
		rc := newReminderCluster(t, newAlarmEnv(), 2)
		cfg := rc.cfg
		cfg.ID, cfg.Transport = "a", rc.net.Transport("a:7100")
		a := start(t, rc.c, rc.rec, cfg)
		env.register(t, a.Runner)
		rc.converge(a)
		if _, err := env.ping.Ask(t.Context(), a, "w", ""); err != nil {
			t.Fatal(err)
		}
		env.mu.Lock()
		env.failNext["w"] = 6
		env.attempts["w"] = nil
		env.mu.Unlock()
		if err := env.boom.Tell(t.Context(), a, "w", ""); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Second)
		env.mu.Lock()
		at := env.attempts["w"]
		env.mu.Unlock()
		if len(at) != 7 {
			t.Fatalf("%d activations after the panic, want 6 failed and 1 that started: %v", len(at), at)
		}
		for i := 2; i < len(at); i++ {
			if at[i].Sub(at[i-1]) < at[i-1].Sub(at[i-2]) {
				t.Fatalf("back-off shrank: %v", at)
			}
		}
		if l := env.live("twin", "w"); len(l) != 1 {
			t.Fatalf("w lives on %v after its failures, want once", l)
		}
	})
}

// TestRememberedStartRateSpreadsAColdStart: a runner taking over a shard
// with many remembered entities activates them all without a message, no
// faster than RememberedStartRate.
func TestRememberedStartRateSpreadsAColdStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newTwinEnv()
		rc := newReminderCluster(t, newAlarmEnv(), 1)
		rc.cfg.RememberedStartRate = 1000
		run := func(id string) *started {
			cfg := rc.cfg
			cfg.ID, cfg.Transport = id, rc.net.Transport(id+":7100")
			s := start(t, rc.c, rc.rec, cfg)
			env.register(t, s.Runner)
			return s
		}
		a := run("a")
		rc.converge(a)
		const n = 3000
		for i := range n {
			if err := env.boom.Tell(t.Context(), a, fmt.Sprint("e", i), ""); err != nil { // activates, then restarts
				t.Fatal(err)
			}
		}
		waitFor(t, 30*time.Second, "the markers written", func() bool { return len(markers(t, a.store, 1)) == n })
		a.Close()
		env.mu.Lock()
		from := len(env.lives)
		env.mu.Unlock()
		b := run("b")
		rc.converge(b)
		waitFor(t, 30*time.Second, "every remembered entity running on b", func() bool { return b.Status().Remembered == n && b.Status().Entities == n })
		env.mu.Lock()
		defer env.mu.Unlock()
		var first, last time.Time
		seen := map[string]bool{}
		for _, l := range env.lives[from:] {
			if l.runner != "b" {
				continue
			}
			if l.reason != entity.ActivateRemembered {
				t.Fatalf("%s activated on b for %q, want %q", l.id, l.reason, entity.ActivateRemembered)
			}
			seen[l.id] = true
			if first.IsZero() || l.start.Before(first) {
				first = l.start
			}
			if l.start.After(last) {
				last = l.start
			}
		}
		if len(seen) != n {
			t.Fatalf("%d entities activated on b, want %d", len(seen), n)
		}
		// 1000 a second after a burst of 100: at least 2.9 s for 3000.
		if span := last.Sub(first); span < 2800*time.Millisecond {
			t.Errorf("%d activations in %v: faster than RememberedStartRate 1000/s", n, span)
		}
	})
}

// TestBadRememberedMarkersAreLoggedWithTheirKey: a marker of a kind this
// runner does not host (or hosts without the Remembered option) is logged
// with its key and not activated; the others start.
func TestBadRememberedMarkersAreLoggedWithTheirKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newTwinEnv()
		rc := newReminderCluster(t, newAlarmEnv(), 1)
		var buf testenv.SyncBuffer
		cfg := rc.cfg
		cfg.ID, cfg.Transport = "a", rc.net.Transport("a:7100")
		a := start(t, rc.c, rc.rec, cfg)
		env.register(t, a.Runner)
		rc.converge(a)
		if _, err := env.ping.Ask(t.Context(), a, "good", ""); err != nil {
			t.Fatal(err)
		}
		_, epoch, ok := a.ShardContext(0)
		if !ok {
			t.Fatal("a does not own shard 0")
		}
		res, err := a.store.WriteShardStates(t.Context(), []storage.ShardWrite{{Shard: 0, Epoch: epoch,
			PutRemembered: []storage.EntityRef{{Kind: "ghost", ID: "g1"}, {Kind: "plain", ID: "p1"}}}})
		if err != nil || res[0].Err != nil {
			t.Fatal(err, res)
		}
		waitFor(t, 5*time.Second, "the marker of good", func() bool { return len(markers(t, a.store, 1)) == 3 })
		a.Close()
		cfg.ID, cfg.Transport = "b", rc.net.Transport("b:7100")
		cfg.Logger = slog.New(slog.NewTextHandler(&buf, nil))
		b := start(t, rc.c, rc.rec, cfg)
		env.register(t, b.Runner)
		rc.converge(b)
		waitFor(t, 20*time.Second, "good running on b", func() bool {
			l := env.live("twin", "good")
			return len(l) == 1 && l[0] == "b"
		})
		time.Sleep(time.Second)
		out := buf.String()
		for _, key := range []string{"remembered/0/ghost%2Fg1", "remembered/0/plain%2Fp1"} {
			if !strings.Contains(out, key) {
				t.Errorf("no log line names %s:\n%s", key, out)
			}
		}
		if l := env.live("plain", "p1"); len(l) != 0 {
			t.Errorf("an entity of a kind without the option was activated from a marker: %v", l)
		}
	})
}
