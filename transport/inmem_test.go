package transport

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// countingHandler echoes and counts the deliveries it ran.
type countingHandler struct{ ran atomic.Int64 }

func (h *countingHandler) Deliver(_ context.Context, req *DeliverRequest) (*DeliverResponse, func()) {
	h.ran.Add(1)
	return &DeliverResponse{Payload: req.Payload, Epoch: 7}, func() {}
}

func (h *countingHandler) Hot(shard uint32, limit int) []EntityRef {
	return []EntityRef{{Kind: "k", ID: "hot"}}
}

// TestInmemDeliversAndReportsFaults: the in-memory transport answers like
// the gRPC one, and its faults give the errors a sender acts on: an
// unreachable owner is ErrNotSent (nothing ran), a lost answer is
// ErrMaybeDelivered (the handler ran), a closed receiver refuses new
// deliveries.
func TestInmemDeliversAndReportsFaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewInmemNetwork()
		h := &countingHandler{}
		srv, cli := n.Transport("a"), n.Transport("c")
		if addr, err := srv.Listen(h); err != nil || addr != "a" {
			t.Fatalf("Listen = %q, %v", addr, err)
		}
		if _, err := n.Transport("a").Listen(h); err == nil {
			t.Error("a second transport listened at the same address")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req := &DeliverRequest{Kind: "k", Method: "m", Entity: "e", Payload: []byte("hi")}
		resp, sent, err := cli.Call(ctx, "a", req)
		if err != nil || !sent || string(resp.Payload) != "hi" || resp.Epoch != 7 {
			t.Fatalf("Call = %+v, sent %v, %v", resp, sent, err)
		}
		if hot, err := cli.Hot(ctx, "a", 1, 10); err != nil || len(hot) != 1 || hot[0].ID != "hot" {
			t.Fatalf("Hot = %v, %v", hot, err)
		}

		n.Cut("c", "a", true)
		start := time.Now()
		if _, sent, err := cli.Call(ctx, "a", req); sent || !errors.Is(err, ErrNotSent) {
			t.Fatalf("Call across a cut = sent %v, %v; want ErrNotSent", sent, err)
		}
		if waited := time.Since(start); waited != n.ConnectTimeout {
			t.Errorf("a cut call failed after %v, want ConnectTimeout %v", waited, n.ConnectTimeout)
		}
		n.Cut("c", "a", false)

		n.LoseAnswers("a", true)
		before := h.ran.Load()
		short, cancelShort := context.WithTimeout(ctx, time.Second)
		if _, sent, err := cli.Call(short, "a", req); !sent || !errors.Is(err, ErrMaybeDelivered) {
			t.Fatalf("Call with a lost answer = sent %v, %v; want ErrMaybeDelivered", sent, err)
		}
		cancelShort()
		if h.ran.Load() != before+1 {
			t.Error("the handler of a lost answer did not run")
		}
		n.LoseAnswers("a", false)

		n.SetLatency(50 * time.Millisecond)
		start = time.Now()
		if _, _, err := cli.Call(ctx, "a", req); err != nil {
			t.Fatal(err)
		}
		if rtt := time.Since(start); rtt != 100*time.Millisecond {
			t.Errorf("round trip %v with 50ms latency each way, want 100ms", rtt)
		}
		n.SetLatency(0)

		srv.Close(time.Second)
		if _, sent, err := cli.Call(ctx, "a", req); sent || !errors.Is(err, ErrNotSent) {
			t.Fatalf("Call to a closed transport = sent %v, %v; want ErrNotSent", sent, err)
		}
		cli.Close(0)
		if _, sent, err := cli.Call(ctx, "a", req); sent || !errors.Is(err, ErrClosed) {
			t.Fatalf("Call from a closed transport = sent %v, %v; want ErrClosed", sent, err)
		}
	})
}
