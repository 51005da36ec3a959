package runner_test

import (
	"context"
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
		close(until)
		got, err := heldGet.Ask(ctx, r, "drained", struct{}{})
		if err != nil || got != want {
			b.Fatalf("entity counted %d of %d tells (%v)", got, want, err)
		}
	}
}
