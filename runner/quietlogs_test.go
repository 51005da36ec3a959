package runner_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
)

// warnings returns the lines at WARN and above.
func (lc *logCapture) warnings() []logLine {
	var out []logLine
	for _, l := range lc.all() {
		if l.Level >= slog.LevelWarn {
			out = append(out, l)
		}
	}
	return out
}

// TestGracefulShutdownLooksHealthy: starting, serving and shutting down
// gracefully — alone, and handing shards to a peer, with transports (the
// shutdown lingers on its transport after revoking its lease) — logs
// nothing at WARN or above and emits no Detached event: an alert on either
// must not fire on every deploy.
func TestGracefulShutdownLooksHealthy(t *testing.T) {
	t.Parallel()
	for _, peers := range []int{0, 1} {
		t.Run(map[int]string{0: "alone", 1: "handing off"}[peers], func(t *testing.T) {
			k := newTestKind(false)
			c := memory.NewCluster()
			t.Cleanup(c.Close)
			var lc logCapture
			var rec recorder
			rs := []*started{start(t, c, &rec, runner.Config{ID: "a", NumShards: 8, ListenAddr: "127.0.0.1:0", Logger: lc.logger(t)})}
			for i := range peers {
				rs = append(rs, start(t, c, &rec, runner.Config{ID: string(rune('b' + i)), NumShards: 8, ListenAddr: "127.0.0.1:0", Logger: lc.logger(t)}))
			}
			for _, r := range rs {
				if err := r.Register(k.kind); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, 30*time.Second, "partition", func() bool { ok, _ := partitionOK(rs, 8); return ok })
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			for i := range 20 {
				if _, err := k.inc.Ask(ctx, rs[0], idFor(rs[0].ownedShard(), 8, string(rune('a'+i))), incReq{By: 1}); err != nil {
					t.Fatal(err)
				}
			}
			if err := rs[0].Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			if peers > 0 {
				waitFor(t, 30*time.Second, "the peer owns every shard", func() bool { return len(rs[1].Owned()) == 8 })
			}
			time.Sleep(time.Second) // anything logged late
			for _, l := range lc.warnings() {
				t.Errorf("logged during a healthy run and a graceful shutdown: %v", l)
			}
			if d := detachedEvents(rec.all()); len(d) > 0 {
				t.Errorf("Detached events during a graceful shutdown: %+v", d)
			}
		})
	}
}

// ownedShard returns one shard r owns.
func (s *started) ownedShard() sharding.ShardID {
	for id := range s.Owned() {
		return id
	}
	panic("owns nothing")
}
