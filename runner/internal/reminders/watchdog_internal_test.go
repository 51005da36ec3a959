package reminders

import (
	"context"
	"fmt"
	"github.com/shardhost/shardhost/internal/testenv"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/runner/internal/schedule"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// acquire takes shard id for a new client named name of c and returns the
// client and its epoch.
func acquire(t *testing.T, c *memory.Cluster, name string, id sharding.ShardID) (*memory.Store, storage.Epoch) {
	t.Helper()
	st := c.NewStore(name)
	l, err := st.Grant(t.Context(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.Acquire(t.Context(), l.ID, storage.Owner{RunnerID: name}, []sharding.ShardID{id})
	if err != nil || len(res) != 1 || res[0].Status != storage.Acquired {
		t.Fatalf("acquire shard %d for %s: %+v, %v", id, name, res, err)
	}
	if _, err := st.Release(t.Context(), l.ID, nil); err != nil {
		t.Fatal(err)
	}
	return st, res[0].Epoch
}

// TestWatchdogReloadsASetLeftWithoutItsStoreCall: the safety net under the
// liveness rule. A set whose state asks for a store call that nobody will
// make (here it was taken off the queue by hand, the kind of bug that once
// kept a shard's reminders from firing for good) fires again once the
// watchdog reloads it: not before StuckAfter, then logged at WARN with its
// shard and cause and counted by cause.
func TestWatchdogReloadsASetLeftWithoutItsStoreCall(t *testing.T) {
	for _, markedQueued := range []bool{false, true} {
		t.Run(fmt.Sprintf("marked queued %v", markedQueued), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { checkWatchdogReloads(t, markedQueued) })
		})
	}
}

// checkWatchdogReloads is TestWatchdogReloadsASetLeftWithoutItsStoreCall,
// the set left marked queued or not.
func checkWatchdogReloads(t *testing.T, markedQueued bool) {
	{
		c := memory.NewCluster()
		defer c.Close()
		const id = sharding.ShardID(3)
		// The predecessor leaves a final progress record, fenced by its
		// epoch, then lets the lock go.
		prev, prevEpoch := acquire(t, c, "prev", id)
		final := &storage.ReminderProgress{Shard: id, Epoch: prevEpoch, Final: true, Cut: time.Now().UTC()}
		if res, err := prev.WriteShardStates(t.Context(), []storage.ShardWrite{{Shard: id, Epoch: prevEpoch, Progress: final}}); err != nil || res[0].Err != nil {
			t.Fatalf("predecessor's progress: %+v, %v", res, err)
		}
		c.Delete(storage.LockKey(id))
		st, epoch := acquire(t, c, "a", id)

		rd := sdkmetric.NewManualReader()
		met, err := NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd)).Meter("test"), metric.WithAttributes())
		if err != nil {
			t.Fatal(err)
		}
		logs := &testenv.SyncBuffer{}
		s := New(Config{}, st, nil, schedule.New(schedule.Config{}), met, slog.New(slog.NewTextHandler(logs, nil)))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		s.Acquired(id, epoch, ctx)
		set := s.current(id, epoch)
		if err := s.read(ctx, []*shardSet{set}); err != nil {
			t.Fatal(err)
		}
		set.mu.Lock()
		state := set.st
		set.mu.Unlock()
		if state.name() != "T" {
			t.Fatalf("state after loading the predecessor's final progress: %s, want T", state.name())
		}
		// The bug: the set's rewrite leaves the queue.
		s.mu.Lock()
		s.readQ, s.rewriteQ, set.queued = nil, nil, markedQueued
		s.mu.Unlock()
		loaded := time.Now()
		var wg sync.WaitGroup
		wg.Go(func() { s.Run(ctx) })
		defer wg.Wait()
		defer cancel()

		fires := func() bool {
			set.mu.Lock()
			defer set.mu.Unlock()
			return set.st.fires()
		}
		time.Sleep(DefaultStuckAfter - time.Second)
		if fires() || strings.Contains(logs.String(), "cannot fire") {
			t.Fatalf("before StuckAfter: fires %v, log:\n%s", fires(), logs.String())
		}
		time.Sleep(DefaultStuckAfter / 6)
		synctest.Wait()
		if !fires() {
			t.Fatalf("%v after its load the set still cannot fire; log:\n%s", time.Since(loaded), logs.String())
		}
		if !strings.Contains(logs.String(), `level=WARN msg="reminders: a shard's reminders cannot fire; reloading them from the store" shard=3 epoch=`) ||
			!strings.Contains(logs.String(), "cause=rewrite") {
			t.Errorf("no WARN line with the shard and the cause:\n%s", logs.String())
		}
		if got := reloadsByCause(t, rd); len(got) != 1 || got["rewrite"] != 1 {
			t.Errorf("sharding.reminder_reloads by cause = %v, want rewrite: 1", got)
		}
		p, err := st.ReadShardStates(t.Context(), []sharding.ShardID{id})
		if err != nil || p[0].Progress == nil || p[0].Progress.Final {
			t.Errorf("the store's progress after the set fired again: %+v, %v; want rewritten as not final", p, err)
		}
	}
}

// reloadsByCause reads sharding.reminder_reloads by its cause attribute.
func reloadsByCause(t *testing.T, rd *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "sharding.reminder_reloads" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := p.Attributes.Value(attribute.Key("cause"))
				out[v.AsString()] += p.Value
			}
		}
	}
	return out
}
