package runner_test

import (
	"context"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
)

// drainBatch is how many tells BenchmarkTellEntitySide queues behind a
// held handler before letting the entity run them.
const drainBatch = 60_000

// heldCounter counts tells; Hold blocks its entity until the channel it
// is given closes.
type heldCounter struct{ n int64 }

type holdReq struct{}

// heldUntil is closed to release the held handler (one benchmark at a
// time sets it, before the tell that holds).
var heldUntil chan struct{}

func (c *heldCounter) Add(_ context.Context, r incReq) error { c.n += r.By; return nil }
func (c *heldCounter) Get(context.Context, struct{}) (int64, error) {
	return c.n, nil
}
func (c *heldCounter) Hold(context.Context, holdReq) error { <-heldUntil; return nil }

var (
	heldKind = entity.NewKind("bench-held", func(string) *heldCounter { return &heldCounter{} },
		entity.Mailbox(drainBatch+2), entity.IdleAfter(time.Hour))
	heldAdd  = entity.Signal(heldKind, "add", (*heldCounter).Add)
	heldGet  = entity.Method(heldKind, "get", (*heldCounter).Get)
	heldHold = entity.Signal(heldKind, "hold", (*heldCounter).Hold)
)

// BenchmarkTellEntitySide: what one tell costs on its entity's goroutine
// alone, the side that bounds BenchmarkTell's rate: drainBatch tells are
// queued behind a held handler, and the clock runs from the handler's
// release until the entity answered an ask queued after them. The
// senders' side (routing, admission, the push) is outside the clock.
func BenchmarkTellEntitySide(b *testing.B) {
	r := benchRunner(b)
	if err := r.Register(heldKind); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	want := int64(0)
	var cpu time.Duration
	b.ResetTimer()
	for sent := 0; sent < b.N; {
		b.StopTimer()
		until := make(chan struct{})
		heldUntil = until
		if err := heldHold.Tell(ctx, r, "drained", holdReq{}); err != nil {
			b.Fatal(err)
		}
		n := min(drainBatch, b.N-sent)
		for range n {
			if err := heldAdd.Tell(ctx, r, "drained", incReq{By: 1}); err != nil {
				b.Fatal(err)
			}
		}
		sent += n
		want += int64(n)
		b.StartTimer()
		c0 := processCPU(b)
		close(until)
		got, err := heldGet.Ask(ctx, r, "drained", struct{}{})
		cpu += processCPU(b) - c0
		if err != nil || got != want {
			b.Fatalf("entity counted %d of %d tells (%v)", got, want, err)
		}
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// processCPU returns the CPU time (user + system) the process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkTellRef is BenchmarkTell through a runner.Ref on the entity
// (the like-for-like comparison with other actor systems' PIDs).
func BenchmarkTellRef(b *testing.B) {
	r := benchRunner(b)
	ctx := context.Background()
	ref := r.Ref(benchKind, "hot")
	if _, err := benchInc.Ask(ctx, ref, "hot", incReq{}); err != nil { // activate
		b.Fatal(err)
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		for benchAdd.Tell(ctx, ref, "hot", incReq{By: 1}) != nil {
			runtime.Gosched() // mailbox full: let the entity catch up
		}
		n++
	}
	got, err := benchInc.Ask(ctx, ref, "hot", incReq{})
	if err != nil || got != int64(n) {
		b.Fatalf("entity saw %d of %d messages (%v)", got, n, err)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkTellSenderSide: what one tell costs its sender alone (by ID,
// and through a runner.Ref): drainBatch tells are queued behind a held
// handler with the clock running; their handling is outside it.
func BenchmarkTellSenderSide(b *testing.B) {
	for _, via := range []string{"id", "ref"} {
		b.Run("via="+via, func(b *testing.B) {
			r := benchRunner(b)
			if err := r.Register(heldKind); err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			var snd entity.Sender = r
			if via == "ref" {
				snd = r.Ref(heldKind, "pushed")
			}
			want := int64(0)
			var cpu time.Duration
			b.ResetTimer()
			for sent := 0; sent < b.N; {
				b.StopTimer()
				until := make(chan struct{})
				heldUntil = until
				if err := heldHold.Tell(ctx, snd, "pushed", holdReq{}); err != nil {
					b.Fatal(err)
				}
				n := min(drainBatch, b.N-sent)
				b.StartTimer()
				c0 := processCPU(b)
				for range n {
					if err := heldAdd.Tell(ctx, snd, "pushed", incReq{By: 1}); err != nil {
						b.Fatal(err)
					}
				}
				cpu += processCPU(b) - c0
				b.StopTimer()
				sent += n
				want += int64(n)
				close(until)
				got, err := heldGet.Ask(ctx, snd, "pushed", struct{}{})
				if err != nil || got != want {
					b.Fatalf("entity counted %d of %d tells (%v)", got, want, err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
