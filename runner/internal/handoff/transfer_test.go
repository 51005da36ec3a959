package handoff

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/shardhost/shardhost/storage"
)

// TestTransferVerdict: a transfer that moved the lock disowns the shard;
// one refused because the lock is not ours loses it; one whose outcome
// stayed unknown drops it; one the store refused for sure (the lock still
// ours) reopens it. Errors are matched wrapped, and an outcome resolved
// afterwards (moved or not) wins over the call's error.
func TestTransferVerdict(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("transfer shard 3: %w", err) }
	for _, tc := range []struct {
		t        Transfer
		definite bool
		want     Verdict
	}{
		{TransferOf(nil, 50), true, Moved},
		{TransferOf(wrap(storage.ErrNotOwner), 0), true, Lost},
		{TransferOf(wrap(storage.ErrNoHandoff), 0), true, Reopen},
		{TransferOf(storage.ErrLeaseNotFound, 0), true, Reopen},
		{TransferOf(storage.ErrInvalidArgument, 0), true, Reopen},
		{TransferOf(context.DeadlineExceeded, 0), false, Unknown},
		{TransferOf(errors.New("connection reset"), 0), false, Unknown},
		{Transfer{Moved: true, Definite: true, Err: context.DeadlineExceeded}, true, Moved},   // resolved: gone
		{Transfer{Moved: false, Definite: true, Err: context.DeadlineExceeded}, true, Reopen}, // resolved: still ours
	} {
		if got := tc.t.Verdict(); got != tc.want {
			t.Errorf("%+v.Verdict() = %v, want %v", tc.t, got, tc.want)
		}
		if tc.t.Definite != tc.definite {
			t.Errorf("%+v: definite %v, want %v", tc.t, tc.t.Definite, tc.definite)
		}
	}
	if tr := TransferOf(nil, 50); !tr.Moved || tr.Epoch != 50 {
		t.Errorf("TransferOf(nil, 50) = %+v", tr)
	}
}

// TestDefiniteTransfer: success and the store's sure refusals (wrapped or
// not) settle whether the lock moved; timeouts, cancellations and
// transport errors do not.
func TestDefiniteTransfer(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, true},
		{storage.ErrNoHandoff, true},
		{storage.ErrLeaseNotFound, true},
		{fmt.Errorf("txn: %w", storage.ErrNotOwner), true},
		{fmt.Errorf("txn: %w", storage.ErrInvalidArgument), true},
		{context.DeadlineExceeded, false},
		{context.Canceled, false},
		{errors.New("connection reset"), false},
	} {
		if got := DefiniteTransfer(tc.err); got != tc.want {
			t.Errorf("DefiniteTransfer(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
