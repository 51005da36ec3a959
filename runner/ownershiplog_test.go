package runner_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

// sumAttr sums the integer attribute key of lines.
func sumAttr(t *testing.T, lines []logLine, key string) int {
	t.Helper()
	sum := 0
	for _, l := range lines {
		n, err := strconv.Atoi(l.Attrs[key])
		if err != nil {
			t.Fatalf("line %v: %s = %q", l, key, l.Attrs[key])
		}
		sum += n
	}
	return sum
}

// TestOwnershipChangesLoggedPerRound: takeovers and handoffs show at INFO
// with their shard counts, one line per control round, not one per shard.
func TestOwnershipChangesLoggedPerRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		var la, lb logCapture
		a := start(t, c, nil, runner.Config{ID: "a", NumShards: 64, Logger: la.logger(t)})
		waitFor(t, 10*time.Second, "a owns every shard", func() bool { return len(a.Owned()) == 64 })
		time.Sleep(time.Second) // the round that acquired them logs when it ends
		if got := sumAttr(t, la.find(slog.LevelInfo, "shard ownership changed", "runner", "a"), "acquired"); got != 64 {
			t.Errorf("a logged %d acquisitions at start, want 64", got)
		}

		// b joins: half the shards move by handoff.
		b := start(t, c, nil, runner.Config{ID: "b", NumShards: 64, Logger: lb.logger(t)})
		waitFor(t, 30*time.Second, "partition", func() bool { ok, _ := partitionOK([]*started{a, b}, 64); return ok })
		time.Sleep(time.Second)
		moved := len(b.Owned())
		inB := lb.find(slog.LevelInfo, "shard ownership changed", "runner", "b")
		outA := la.find(slog.LevelInfo, "shard ownership changed", "runner", "a")[1:]
		if sumAttr(t, inB, "acquired") != moved || sumAttr(t, inB, "by_handoff") != moved ||
			sumAttr(t, outA, "handed_off") != moved || sumAttr(t, outA, "released") != moved {
			t.Errorf("%d shards moved by handoff; b logged %v, a logged %v", moved, inB, outA)
		}
		if len(inB) >= moved || len(outA) >= moved {
			t.Errorf("%d and %d lines for %d moved shards: want one per round, not one per shard", len(inB), len(outA), moved)
		}

		// b crashes: a takes its shards over once b's lease expires.
		b.Close()
		waitFor(t, time.Minute, "a owns every shard again", func() bool { return len(a.Owned()) == 64 })
		time.Sleep(time.Second)
		all := la.find(slog.LevelInfo, "shard ownership changed", "runner", "a")
		takeover := all[1+len(outA):]
		if got := sumAttr(t, takeover, "acquired"); got != moved || len(takeover) >= moved {
			t.Errorf("takeover of %d shards logged as %v", moved, takeover)
		}
	})
}

type grumpy struct{}

type grumbleReq struct{}

func (*grumpy) Grumble(context.Context, grumbleReq) error { return errors.New("not today") }

// TestSignalHandlerErrorsVisible: a signal's handler error is logged at
// WARN (rate-limited per kind and signal, counting what it did not log) and
// counted in sharding.signal_failures.
func TestSignalHandlerErrorsVisible(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := entity.NewKind("grumpy", func(string) *grumpy { return &grumpy{} })
		grumble := entity.Signal(k, "grumble", (*grumpy).Grumble)
		rd := sdkmetric.NewManualReader()
		var lc logCapture
		_, r, _ := startOwningAll(t, runner.Config{ID: "a", NumShards: 4, Logger: lc.logger(t),
			MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))}, k)
		for range 100 {
			if err := grumble.Tell(t.Context(), r, "g", grumbleReq{}); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		time.Sleep(11 * time.Second)
		if err := grumble.Tell(t.Context(), r, "g", grumbleReq{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		warns := lc.find(slog.LevelWarn, "signal handler failed", "kind", "grumpy", "method", "grumble", "err", "not today")
		if len(warns) != 2 || warns[0].Attrs["suppressed"] != "0" || warns[1].Attrs["suppressed"] != "99" {
			t.Errorf("WARN lines = %v, want two: the first failure, then the next after 10s counting the 99 in between", warns)
		}
		if got := readMetrics(t, rd)["sharding.signal_failures"]; got != 101 {
			t.Errorf("sharding.signal_failures = %v, want 101", got)
		}
	})
}
