package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// TestCartsExpireOnceAcrossAMoveAndACrash runs the demo on an embedded
// etcd: every abandoned cart expires, never early, once (a redelivered
// expiry after the crash is applied once), no checked-out cart expires,
// and the summary's periodic reminder reports. No goleak here: the
// embedded etcd server leaves goroutines behind after Close.
func TestCartsExpireOnceAcrossAMoveAndACrash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd and waits for a lease to expire")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out bytes.Buffer
	res, err := run(ctx, options{carts: 80, out: &out, logs: io.Discard})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if len(res.Problems) > 0 {
		t.Fatalf("problems: %q", res.Problems)
	}
	if res.Expired != res.Abandoned || res.Abandoned != 40 || res.CheckedOut != 40 {
		t.Errorf("expired %d of %d abandoned carts, %d checked out", res.Expired, res.Abandoned, res.CheckedOut)
	}
	if res.OnCrashed == 0 {
		t.Error("no abandoned cart on the crashed runner: the crash proved nothing")
	}
	if !strings.Contains(out.String(), "OK:") {
		t.Error("no OK verdict")
	}
}
