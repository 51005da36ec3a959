package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

func put(t *testing.T, cli *clientv3.Client, key, val string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, key, val); err != nil {
		t.Fatalf("Put(%q) error = %v", key, err)
	}
}

func get(ctx context.Context, cli *clientv3.Client, key string) (string, error) {
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return "", err
	}
	if len(resp.Kvs) == 0 {
		return "", fmt.Errorf("key %q not found", key)
	}
	return string(resp.Kvs[0].Value), nil
}

func mustGet(t *testing.T, cli *clientv3.Client, key, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	got, err := get(ctx, cli, key)
	if err != nil || got != want {
		t.Fatalf("Get(%q) = %q, %v; want %q", key, got, err, want)
	}
}

// eventually calls op with a per-try timeout until it succeeds, failing the
// test after limit; it returns how long it took.
func eventually(t *testing.T, limit, try time.Duration, op func(ctx context.Context) error) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), try)
		err := op(ctx)
		cancel()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("not successful within %v: %v", limit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
