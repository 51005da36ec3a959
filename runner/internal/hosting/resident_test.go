package hosting

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/shardhost/shardhost/entity"
)

func TestResidentMailboxSitsOnItsOwnCacheLines(t *testing.T) {
	var e resident
	// At 256 bytes a resident is allocated 256-aligned (its size class),
	// so offsets 0, 64, 128 and 192 start cache lines.
	if size := unsafe.Sizeof(e); size != 256 {
		t.Fatalf("resident is %d bytes, want 256: re-check the grouping of its fields by writer", size)
	}
	if end := unsafe.Offsetof(e.lastUsed) + unsafe.Sizeof(e.lastUsed); end > 128 {
		t.Errorf("the entity's fields end at byte %d, want within the first 128", end)
	}
	if mu := unsafe.Offsetof(e.mu); mu != 128 {
		t.Errorf("the mailbox starts at byte %d, want 128", mu)
	}
}

// seq records the order its messages ran in; a message with Block set
// waits at the test gate (hosting_test.go) first.
type seq struct{ got []int }

type seqReq struct {
	N     int
	Block bool
}

var (
	seqKind = entity.NewKind("seq", func(string) *seq { return &seq{} }, entity.Mailbox(300))
	_       = entity.Signal(seqKind, "add", func(s *seq, _ context.Context, r seqReq) error {
		if r.Block {
			blockAtGate()
		}
		s.got = append(s.got, r.N)
		return nil
	})
	_ = entity.Method(seqKind, "get", func(s *seq, _ context.Context, _ struct{}) ([]int, error) {
		return slices.Clone(s.got), nil
	})
)

func TestMailboxKeepsOrderAndItsBoundAcrossChunks(t *testing.T) {
	f, k, add, get := newSeqFixture(t)
	tell := func(r seqReq) Result {
		return f.shard.Deliver(context.Background(), k, add, "s", r, true, false, false)
	}
	for round := range 3 { // the mailbox fills past its head, drains, and fills again
		open := newGate(t)
		if res := tell(seqReq{N: -1, Block: true}); res.Err != nil {
			t.Fatal(res)
		}
		wait(t, started, "the blocking handler")
		for i := range 300 { // the bound: one head of chunkLen, then chunks
			if res := tell(seqReq{N: i}); res.Err != nil {
				t.Fatalf("round %d: tell %d of 300 = %+v, want it queued", round, i, res)
			}
		}
		if res := tell(seqReq{N: 300}); !errors.Is(res.Err, entity.ErrMailboxFull) || !res.Undelivered {
			t.Fatalf("round %d: tell past the bound = %+v, want undelivered ErrMailboxFull", round, res)
		}
		open()
		res := f.shard.Deliver(context.Background(), k, get, "s", struct{}{}, false, false, false)
		for errors.Is(res.Err, entity.ErrMailboxFull) { // still draining
			time.Sleep(time.Millisecond)
			res = f.shard.Deliver(context.Background(), k, get, "s", struct{}{}, false, false, false)
		}
		if res.Err != nil {
			t.Fatal(res)
		}
		got := res.V.([]int)
		if len(got) != 301*(round+1) {
			t.Fatalf("round %d: %d messages ran, want %d", round, len(got), 301*(round+1))
		}
		for i, n := range got[301*round:] {
			if n != i-1 {
				t.Fatalf("round %d: message %d ran as %d, want %d (in the order sent)", round, i, n, i-1)
			}
		}
	}
}

func TestMailboxZeroesWhatRanAndGivesItsChunksBack(t *testing.T) {
	var q mailbox
	payload := new(int)
	for range 3*chunkLen + 5 {
		q.push(&message{req: payload})
	}
	ran := 0
	q.each(func(m *message) {
		if m.req != payload {
			t.Fatalf("message %d = %+v, want the one pushed", ran, m)
		}
		ran++
	})
	if ran != 3*chunkLen+5 || q.first != nil || q.last != nil {
		t.Fatalf("ran %d of %d, chunks left %v/%v, want all run and none kept", ran, 3*chunkLen+5, q.first, q.last)
	}
	for i := range q.head {
		if m := q.head[i]; m.req != nil || m.h != nil {
			t.Fatalf("head[%d] = %+v after it ran, want zeroed (no reference kept)", i, m)
		}
	}
}

// TestEveryHandlerStartAndAskEndReadsTheClock: handlers run back to back
// from one mailbox batch each read the clock at their start (the
// detach-instant check) — none starts on an earlier reading, which would
// widen the window in which a paused process starts a handler after the
// detach instant — and an ask's handler again at its end (its result is
// withheld after the detach instant); a signal's end check reads none.
func TestEveryHandlerStartAndAskEndReadsTheClock(t *testing.T) {
	f, k, add, get := newSeqFixture(t)
	tell := func(r seqReq) {
		t.Helper()
		if res := f.shard.Deliver(context.Background(), k, add, "s", r, true, false, false); res.Err != nil {
			t.Fatal(res)
		}
	}
	waitN := func(n int32) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			f.shard.mu.RLock()
			e := f.shard.entities.get(k, "s")
			f.shard.mu.RUnlock()
			e.mu.Lock()
			queued := e.n
			e.mu.Unlock()
			if queued >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("never %d messages queued", n)
			}
		}
	}
	open := newGate(t)
	tell(seqReq{Block: true})
	wait(t, started, "the blocking signal")
	// One batch behind it: a signal, an ask, a signal.
	tell(seqReq{N: 1})
	asked := make(chan Result, 1)
	go func() { asked <- f.shard.Deliver(context.Background(), k, get, "s", struct{}{}, false, false, false) }()
	waitN(2)
	tell(seqReq{N: 2})
	waitN(3)
	before := f.env.reads.Load()
	open()
	if res := wait(t, asked, "the ask"); res.Err != nil {
		t.Fatal(res)
	}
	for deadline := time.Now().Add(10 * time.Second); f.shard.Running() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the entity's goroutine never exited")
		}
	}
	// The blocking signal's end check reads none; then a start check for
	// each of the batch's three messages, and the ask's end check.
	if got := f.env.reads.Load() - before; got != 4 {
		t.Errorf("clock readings = %d, want 4", got)
	}
}

func TestKindOfFindsRegisteredDescriptorsOnly(t *testing.T) {
	f := newFixture(t, 0)
	if err := f.host.Register(seqKind); err != nil {
		t.Fatal(err)
	}
	// Another descriptor named like a registered kind: not that kind (the
	// router then looks its name up and its handlers by name).
	twin := entity.NewKind("seq", func(string) *seq { return &seq{} })
	for _, c := range []struct {
		d    entity.Descriptor
		want *Kind
	}{
		{workKind, f.host.Kind("worker")},
		{seqKind, f.host.Kind("seq")},
		{twin, nil},
	} {
		if got := f.host.KindOf(c.d); got != c.want {
			t.Errorf("KindOf(%s %p) = %v, want %v", c.d.Name(), c.d, got, c.want)
		}
	}
}

// newSeqFixture is a fixture with seqKind registered, and its kind and
// handlers.
func newSeqFixture(t *testing.T) (f *fixture, k *Kind, add, get *entity.Handler) {
	t.Helper()
	f = newFixture(t, 0)
	if err := f.host.Register(seqKind); err != nil {
		t.Fatal(err)
	}
	k = f.host.Kind("seq")
	add, _ = k.Desc.Handler("add")
	get, _ = k.Desc.Handler("get")
	return f, k, add, get
}
