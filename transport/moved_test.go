package transport

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// movesHandler records the Moved calls it hears.
type movesHandler struct {
	echoHandler
	mu    sync.Mutex
	from  []string
	moves [][]ShardMove
}

func (h *movesHandler) Moved(from string, moves []ShardMove) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.from = append(h.from, from)
	h.moves = append(h.moves, moves)
}

var someMoves = []ShardMove{
	{Shard: 7, Epoch: 1 << 40, Lease: 0x694d9a2b3c4d5e6f, Incarnation: "b-1f2e"},
	{Shard: 65535, Epoch: 3, Lease: 1, Incarnation: ""},
}

// TestMovedReachesTheReceiver: a Moved call carries the sender and every
// move, field for field, to the receiving runner's handler — over gRPC
// and in memory alike.
func TestMovedReachesTheReceiver(t *testing.T) {
	check := func(t *testing.T, h *movesHandler) {
		t.Helper()
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.moves) != 1 || h.from[0] != "a" || !slices.Equal(h.moves[0], someMoves) {
			t.Fatalf("receiver heard %v from %v, want %v from a", h.moves, h.from, someMoves)
		}
	}
	t.Run("grpc", func(t *testing.T) {
		h := &movesHandler{}
		server := NewGRPC(GRPCConfig{ListenAddr: "127.0.0.1:0", Logger: quiet()})
		addr, err := server.Listen(h)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { server.Close(0) })
		client := startClient(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := client.Moved(ctx, addr, "a", someMoves); err != nil {
			t.Fatal(err)
		}
		check(t, h)
	})
	t.Run("inmem", func(t *testing.T) {
		network := NewInmemNetwork()
		h := &movesHandler{}
		if _, err := network.Transport("b:1").Listen(h); err != nil {
			t.Fatal(err)
		}
		a := network.Transport("a:1")
		if _, err := a.Listen(echoHandler{}); err != nil {
			t.Fatal(err)
		}
		if err := a.Moved(context.Background(), "b:1", "a", someMoves); err != nil {
			t.Fatal(err)
		}
		check(t, h)
		network.Isolate("b:1", true)
		if err := a.Moved(context.Background(), "b:1", "a", someMoves); !errors.Is(err, ErrNotSent) {
			t.Fatalf("Moved to an isolated runner = %v, want ErrNotSent", err)
		}
	})
}

// TestMovedRequestDecodesWithinBounds: a Moved request round-trips, and
// one with more moves than any runner sends is refused as malformed
// instead of costing the receiver unbounded memory.
func TestMovedRequestDecodesWithinBounds(t *testing.T) {
	var got movedRequest
	if err := got.Unmarshal((&movedRequest{Sender: "a", Moves: someMoves}).Marshal()); err != nil || got.Sender != "a" || !slices.Equal(got.Moves, someMoves) {
		t.Fatalf("round trip = %+v, %v", got, err)
	}
	one := protowire.AppendTag(nil, 2, protowire.BytesType)
	one = protowire.AppendBytes(one, protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1))
	var huge []byte
	for range maxMoves + 1 {
		huge = append(huge, one...)
	}
	if err := got.Unmarshal(huge); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a request of %d moves: %v, want ErrMalformed", maxMoves+1, err)
	}
	if err := got.Unmarshal([]byte{0x12, 0x03, 0xff}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a truncated move: %v, want ErrMalformed", err)
	}
}
