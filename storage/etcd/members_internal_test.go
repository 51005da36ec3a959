package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// fakeMember is how one member answers an attempt in the hedge tests.
type fakeMember struct {
	delay time.Duration // then answer
	err   error         // the answer (nil: success)
	hang  bool          // never answer (until the attempt's context ends)
}

type attemptLog struct {
	mu    sync.Mutex
	start []string // "endpoint@offset"
	ended int
}

// run hedges over fakes (endpoints m0, m1, ...) starting with first, with
// a 300 ms attempt timeout inside ctx's bound, and returns the answer,
// the answering member, the attempts (endpoint@offset from the call), the
// time the call took and whether every attempt had ended when it returned.
func run(t *testing.T, fakes []fakeMember, first int, bound time.Duration) (string, string, []string, time.Duration, bool, error) {
	t.Helper()
	list := make([]*member, len(fakes))
	for i := range fakes {
		list[i] = &member{endpoint: fmt.Sprintf("m%d", i)}
	}
	var log attemptLog
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	var stats hedgeStats
	v, m, err := hedge(ctx, list, first, 300*time.Millisecond, &stats, func(ctx context.Context, m *member) (string, error) {
		i := slices.Index(list, m)
		log.mu.Lock()
		log.start = append(log.start, fmt.Sprintf("%s@%v", m.endpoint, time.Since(t0)))
		log.mu.Unlock()
		defer func() { log.mu.Lock(); log.ended++; log.mu.Unlock() }()
		f := fakes[i]
		if f.hang {
			<-ctx.Done()
			return "", ctx.Err()
		}
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
			return "", ctx.Err()
		}
		return "answer of " + m.endpoint, f.err
	})
	took := time.Since(t0)
	log.mu.Lock()
	defer log.mu.Unlock()
	name := ""
	if m != nil {
		name = m.endpoint
	}
	return v, name, log.start, took, log.ended == len(log.start), err
}

func TestHedge(t *testing.T) {
	unavailable := rpctypes.ErrNoLeader // transient: another member may answer
	for _, tc := range []struct {
		name     string
		fakes    []fakeMember
		first    int
		wantFrom string // answering member, "" for an error
		wantErr  error
		attempts []string
		took     time.Duration
	}{
		{
			name:     "first answers",
			fakes:    []fakeMember{{delay: 10 * time.Millisecond}, {}, {}},
			wantFrom: "m0", attempts: []string{"m0@0s"}, took: 10 * time.Millisecond,
		},
		{
			name:     "preferred member first",
			fakes:    []fakeMember{{}, {}, {delay: time.Millisecond}},
			first:    2,
			wantFrom: "m2", attempts: []string{"m2@0s"}, took: time.Millisecond,
		},
		{
			name:     "hung member: next after the attempt timeout",
			fakes:    []fakeMember{{hang: true}, {delay: 5 * time.Millisecond}, {}},
			wantFrom: "m1", attempts: []string{"m0@0s", "m1@300ms"}, took: 305 * time.Millisecond,
		},
		{
			name:     "slow member still wins if it answers first",
			fakes:    []fakeMember{{delay: 400 * time.Millisecond}, {delay: 200 * time.Millisecond}, {}},
			wantFrom: "m0", attempts: []string{"m0@0s", "m1@300ms"}, took: 400 * time.Millisecond,
		},
		{
			name:     "transient failure: next member at once",
			fakes:    []fakeMember{{err: unavailable}, {err: unavailable}, {delay: time.Millisecond}},
			wantFrom: "m2", attempts: []string{"m0@0s", "m1@0s", "m2@0s"}, took: time.Millisecond,
		},
		{
			name:    "definite error is an answer",
			fakes:   []fakeMember{{err: rpctypes.ErrLeaseNotFound}, {}, {}},
			wantErr: rpctypes.ErrLeaseNotFound, attempts: []string{"m0@0s"},
		},
		{
			name:    "all members fail: retried every attempt timeout until the bound",
			fakes:   []fakeMember{{err: unavailable}, {err: unavailable}, {err: unavailable}},
			wantErr: unavailable,
			// Three at once, then one per attempt timeout, round robin.
			attempts: []string{"m0@0s", "m1@0s", "m2@0s", "m0@300ms", "m1@600ms", "m2@900ms"},
			took:     time.Second,
		},
		{
			name:     "all members hang",
			fakes:    []fakeMember{{hang: true}, {hang: true}},
			wantErr:  context.DeadlineExceeded,
			attempts: []string{"m0@0s", "m1@300ms", "m0@600ms", "m1@900ms"},
			took:     time.Second,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				v, from, attempts, took, allEnded, err := run(t, tc.fakes, tc.first, time.Second)
				if tc.wantErr != nil {
					if !errors.Is(err, tc.wantErr) {
						t.Errorf("error = %v, want %v", err, tc.wantErr)
					}
				} else if err != nil || from != tc.wantFrom || v != "answer of "+tc.wantFrom {
					t.Errorf("hedge = %q from %q, %v; want the answer of %s", v, from, err, tc.wantFrom)
				}
				if !slices.Equal(attempts, tc.attempts) {
					t.Errorf("attempts %v, want %v", attempts, tc.attempts)
				}
				if tc.took != 0 && took != tc.took {
					t.Errorf("took %v, want %v", took, tc.took)
				}
				if !allEnded {
					t.Error("returned before every attempt ended")
				}
			})
		})
	}
}
