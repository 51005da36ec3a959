package transport

import (
	"context"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
)

// TestRestartedPeerIsReachableAgainPromptly: a peer that was down long
// enough for gRPC's default reconnect back-off to grow to several seconds
// (12 s: attempts at about 1, 2.6, 5.2, 9.3 and 15.9 s) restarts on the same
// address; once the runner sees it registered again (Forget with the
// address live), a call reaches it within 2 s, not at the next back-off
// attempt.
func TestRestartedPeerIsReachableAgainPromptly(t *testing.T) {
	testenv.SkipIfShort(t, "waits 12 s in real time for the peer's reconnect back-off")
	srv, addr := startServer(t, GRPCConfig{}, nil)
	cli := startClient(t)
	echo(t, t.Context(), cli, addr, "before")

	srv.Close(0)
	cli.Forget(map[string]bool{}) // its record is gone (lease expired)
	down := time.Now()
	for time.Since(down) < 12*time.Second {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		if _, _, err := cli.Call(ctx, addr, &DeliverRequest{Payload: []byte("down")}); err == nil {
			t.Fatal("a call to a stopped peer succeeded")
		}
		cancel()
		time.Sleep(500 * time.Millisecond)
	}

	again := NewGRPC(GRPCConfig{ListenAddr: addr, Logger: quiet()})
	if got, err := again.Listen(echoHandler{}); err != nil || got != addr {
		t.Fatalf("restart on %s: %q, %v", addr, got, err)
	}
	t.Cleanup(func() { again.Close(0) })
	cli.Forget(map[string]bool{addr: true}) // registered again
	restarted := time.Now()
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		_, _, err := cli.Call(ctx, addr, &DeliverRequest{Payload: []byte("after")})
		cancel()
		if err == nil {
			break
		}
		if time.Since(restarted) > 2*time.Second {
			t.Fatalf("the restarted peer is still unreachable %v after it came back: %v", time.Since(restarted).Round(time.Millisecond), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("reachable %v after the restart", time.Since(restarted).Round(time.Millisecond))
}
