package runner

import (
	"context"
	"crypto/tls"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/hostilepeer"
	"github.com/shardhost/shardhost/internal/testenv"
)

// The bounds a runner keeps while a hostile peer works on its transport
// (transport's doc.go, "Bounds", states the transport's): its live heap
// (what a collection finds reachable: hostilepeer.Watch.LiveGrowth) grows
// by at most hostilePeerHeap in all — one message of each shape, two
// connections whose delivery streams the peer fills, one of streams
// beyond the limit, one of unary calls held — and every ask of a
// gateway meanwhile succeeds within hostileAskLatency (a correctness
// bound, generous for a loaded 2-core machine).
const (
	hostilePeerHeap   = 192 << 20
	hostileAskLatency = 5 * time.Second
)

// TestHostilePeerLeavesRunnerServing: a peer the transport admits — in
// plaintext, and over mutual TLS with a valid gateway certificate under
// RequireClusterPeers — sends one message of each shape that makes a
// decoder allocate (megabytes of empty frames, a batch of more frames
// than a sender makes, a request repeated inside a frame, megabytes of
// headers) on rpc Frames, rpc Stream and unary Deliver; floods rpc Frames
// and rpc Stream with requests the runner rejects cheaply and reads no
// answer; opens a thousand streams on one connection ignoring the
// server's limit; and holds unary calls open. Throughout, a gateway's
// asks to the runner's entities succeed within hostileAskLatency, the
// live heap grows by at most hostilePeerHeap, and once the peer leaves the
// runner's goroutines come back to where they were.
func TestHostilePeerLeavesRunnerServing(t *testing.T) {
	for _, secure := range []bool{false, true} {
		name := "plaintext"
		if secure {
			name = "mutual TLS"
		}
		t.Run(name, func(t *testing.T) { hostilePeerAgainstRunner(t, secure) })
	}
}

func hostilePeerAgainstRunner(t *testing.T, secure bool) {
	tc := newTestCluster(t)
	acfg, gcfg := Config{ID: "a"}, Config{ID: "gw", ClientOnly: true}
	var peerTLS *tls.Config
	if secure {
		pki := testenv.NewPKI(t, "cluster")
		acfg.TLS, acfg.PeerTLS = mtls(t, pki, "a")
		acfg.RequireClusterPeers, acfg.ClientPeerNames = true, []string{"gw"}
		_, gcfg.PeerTLS = mtls(t, pki, "gw")
		_, peerTLS = mtls(t, pki, "gw") // the gateway's certificate, in the peer's hands
	}
	a := tc.start(acfg)
	gw := tc.start(gcfg)
	tc.waitOwned(16)
	askOK(t, gw, "warm")
	for i := range 2 * 64 { // every entity active, every connection's delivery stream open
		key := fmt.Sprint("k", i%64)
		if _, err := echoMethod.Ask(context.Background(), gw, key, echoReq{Text: key}); err != nil {
			t.Fatal(err)
		}
	}
	addr := a.Address()

	// The gateway asks every 10 ms, 64 entities in turn, until stopped.
	var (
		stop    = make(chan struct{})
		asking  sync.WaitGroup
		asks    int
		slowest time.Duration
		errs    []error
	)
	asking.Go(func() {
		for i := 0; ; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			start := time.Now()
			key := fmt.Sprint("k", i%64)
			got, err := echoMethod.Ask(ctx, gw, key, echoReq{Text: key})
			took := time.Since(start)
			cancel()
			asks++
			slowest = max(slowest, took)
			if err == nil && got.Text != key {
				err = fmt.Errorf("answer %q to %q", got.Text, key)
			}
			if err != nil && len(errs) < 5 {
				errs = append(errs, err)
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})

	baseline := runtime.NumGoroutine()
	w := hostilepeer.StartWatch()
	var peers []*hostilepeer.Peer
	dial := func() *hostilepeer.Peer {
		p, err := hostilepeer.Dial(addr, peerTLS)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		peers = append(peers, p)
		return p
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(p *hostilepeer.Peer, method string) *hostilepeer.Conversation {
		c, err := p.Open(ctx, method)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// One message of each shape, each on a stream of its own; the
	// answers are read.
	const size = 4 << 20 // the default MaxMessageSize: the most the runner takes (with 64 KiB)
	cheap := hostilepeer.Request("no such kind", "m", "e", []byte("x"))
	shapes := []struct {
		method string
		msg    []byte
	}{
		{hostilepeer.Frames, hostilepeer.EmptyFrames(size)},
		{hostilepeer.Frames, hostilepeer.TinyFrames(4096)},
		{hostilepeer.Frames, hostilepeer.RequestBatch(1, 512, cheap)},
		{hostilepeer.Frames, hostilepeer.Batch(hostilepeer.RepeatedRequest(size, cheap))},
		{hostilepeer.Frames, hostilepeer.Batch(hostilepeer.Frame(1, hostilepeer.RepeatedStrings(size, cheap)))},
		{hostilepeer.Frames, hostilepeer.Batch(hostilepeer.Frame(1, hostilepeer.GiantHeaders(size, cheap)))},
		{hostilepeer.Stream, hostilepeer.RepeatedRequest(size, cheap)},
		{hostilepeer.Stream, hostilepeer.Frame(1, hostilepeer.GiantHeaders(size, cheap))},
		{hostilepeer.Deliver, hostilepeer.GiantHeaders(size, cheap)},
	}
	p := dial()
	received := 0
	for _, s := range shapes {
		c := open(p, s.method)
		if err := c.Send(s.msg); err == nil {
			received += len(s.msg)
		}
		_, _ = c.Finish()
	}

	// Floods of cheap requests whose answers are never read, on rpc
	// Frames and rpc Stream, each on a connection of its own.
	flooded := 0
	for _, f := range []struct {
		method string
		msg    []byte
		per    int
	}{
		{hostilepeer.Frames, hostilepeer.RequestBatch(1, 64, cheap), 64},
		{hostilepeer.Stream, hostilepeer.Frame(1, cheap), 1},
	} {
		c := open(dial(), f.method)
		flooded += f.per * c.FloodUntilHeld(f.msg, 1<<20/f.per, 500*time.Millisecond, nil, nil)
	}

	// A thousand streams on one connection, beyond the server's limit.
	rc, err := hostilepeer.DialRaw(addr, peerTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	for range 1000 {
		if err := rc.Open(hostilepeer.Frames, hostilepeer.RequestBatch(1, 256, cheap)); err != nil {
			t.Fatal(err)
		}
	}

	// Unary calls whose answers are never read (the runner answers them
	// UNKNOWN_KIND: small), as many as the connection lets the peer open.
	up := dial()
	for range 64 {
		octx, ocancel := context.WithTimeout(ctx, 200*time.Millisecond)
		c, err := up.Open(octx, hostilepeer.Deliver)
		if err == nil {
			err = c.Send(cheap)
		}
		ocancel()
		if err != nil {
			break
		}
	}

	time.Sleep(time.Second) // the gateway keeps asking while all of it is held
	peak, alloc := w.Stop()
	live := w.LiveGrowth()
	close(stop)
	asking.Wait()
	t.Logf("%.1f MiB of hostile messages, %d requests flooded before the peer was held back, %d of 1000 streams refused: heap grew %.1f MiB at most, live heap %.1f MiB (%.0f MiB allocated); goroutines %d -> %d; gateway: %d asks, slowest %v",
		float64(received)/(1<<20), flooded, rc.Refused(), float64(peak)/(1<<20), float64(live)/(1<<20), float64(alloc)/(1<<20), baseline, runtime.NumGoroutine(), asks, slowest)
	if len(errs) > 0 || slowest > hostileAskLatency {
		t.Errorf("gateway asks: %d, slowest %v (bound %v), errors %v", asks, slowest, hostileAskLatency, errs)
	}
	// The bound is on what the runner holds, not on the garbage its
	// collector had not reclaimed yet: that part of the peak depends on
	// how late the collector runs, not on the peer (the same 380 MiB
	// allocated peaked at 84-120 MiB in this test alone, idle or beside
	// two CPU hogs, and at 235-325 MiB in the later rounds of the
	// package's -count=5 beside them; the live heap grew 49-63 MiB). A
	// baseline that holds memory of earlier tests freed during the watch
	// reads less (down to 0 in those later rounds): a process of its own
	// would give an exact baseline.
	if live > hostilePeerHeap {
		t.Errorf("the live heap grew by %.1f MiB; bound %.0f MiB", float64(live)/(1<<20), float64(hostilePeerHeap)/(1<<20))
	}
	if flooded >= 1<<20 {
		t.Errorf("the runner read %d requests never answered: not held back", flooded)
	}

	// Once the peer leaves, everything it held is given back.
	cancel()
	rc.Close()
	for _, p := range peers {
		p.Close()
	}
	deadline := time.Now().Add(20 * time.Second)
	for runtime.NumGoroutine() > baseline+5 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines %d, %d before the peer came:\n%s", runtime.NumGoroutine(), baseline, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
