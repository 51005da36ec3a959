package testenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestToxiproxyInFrontOfEtcd(t *testing.T) {
	e := StartEtcd(t)
	start := time.Now()
	tp := StartToxiproxy(t)
	t.Logf("StartToxiproxy ready in %v", time.Since(start).Round(time.Millisecond))

	px := tp.Proxy(t, "etcd", e.Endpoint())
	if px.Addr() == e.Endpoint() {
		t.Fatalf("proxy address %s = upstream address", px.Addr())
	}
	put(t, e.Client(t), "k", "v")
	cli := NewEtcdClient(t, px.Addr())
	mustGet(t, cli, "k", "v")

	recovered := func(t *testing.T) {
		t.Helper()
		took := eventually(t, 10*time.Second, 500*time.Millisecond, func(ctx context.Context) error {
			_, err := get(ctx, cli, "k")
			return err
		})
		t.Logf("Get through the proxy works again %v after Clear/Enable", took.Round(time.Millisecond))
	}

	t.Run("Blackhole", func(t *testing.T) {
		px.Blackhole(t)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := cli.Get(ctx, "k")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Get through blackhole: error = %v, want %v", err, context.DeadlineExceeded)
		}
		if d := time.Since(start); d < 450*time.Millisecond {
			t.Errorf("Get through blackhole failed after %v, want it to hang until its deadline", d)
		}
		px.Clear(t)
		recovered(t)
	})

	t.Run("Latency", func(t *testing.T) {
		px.Latency(t, 300*time.Millisecond)
		px.Latency(t, 200*time.Millisecond) // replaces
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		if _, err := get(ctx, cli, "k"); err != nil {
			t.Fatalf("Get with latency: %v", err)
		}
		if d := time.Since(start); d < 200*time.Millisecond {
			t.Errorf("Get with 200ms latency took %v, want at least 200ms", d)
		}
		// The second call replaced the first (one toxic of 200 ms), which
		// the proxy says; a duration's upper bound would say it only on an
		// idle machine.
		toxics, err := px.Raw().Toxics()
		if err != nil {
			t.Fatal(err)
		}
		var latencies []any
		for _, tx := range toxics {
			if tx.Type == "latency" {
				latencies = append(latencies, tx.Attributes["latency"])
			}
		}
		if len(latencies) != 1 || fmt.Sprint(latencies[0]) != "200" {
			t.Errorf("latency toxics after Latency(300ms) then Latency(200ms): %v, want one of 200 ms", latencies)
		}
		px.Clear(t)
		recovered(t)
	})

	t.Run("ResetPeer", func(t *testing.T) {
		px.ResetPeer(t)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if _, err := cli.Get(ctx, "k"); err == nil {
			t.Fatal("Get through reset_peer succeeded")
		}
		px.Clear(t)
		recovered(t)
	})

	t.Run("Disable", func(t *testing.T) {
		px.Disable(t)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if _, err := cli.Get(ctx, "k"); err == nil {
			t.Fatal("Get through a disabled proxy succeeded")
		}
		px.Enable(t)
		recovered(t)
	})

	toxics, err := px.Raw().Toxics()
	if err != nil || len(toxics) != 0 {
		t.Errorf("Toxics() after Clear = %v, %v; want none", toxics, err)
	}
	if tp.Client() == nil {
		t.Error("Client() = nil")
	}
}
