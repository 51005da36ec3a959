package handoff

import (
	"testing"
	"time"

	"github.com/shardhost/shardhost/storage"
)

// TestDecideOutbound: the old owner cuts over only to a ready record
// written by the assignee for a move from itself at its epoch, and not
// before a pending cutover retry time; releases plainly at once when
// handoffs are off or nobody is assigned, and after HandoffWait without
// such a record; else waits until the end of HandoffWait or the retry
// time, whichever comes first.
func TestDecideOutbound(t *testing.T) {
	const wait = 10 * time.Second
	since := t0
	ready := storage.Handoff{Shard: 3, HandoffRecord: storage.HandoffRecord{From: "me", To: "b", Phase: storage.HandoffReady, FromEpoch: 40}, Lease: 20, ModRevision: 41}
	with := func(f func(*storage.Handoff)) storage.Handoff { h := ready; f(&h); return h }
	base := Outbound{Self: "me", Epoch: 40, Assignee: "b", UnassignedSince: since, Now: since.Add(time.Second), HandoffWait: wait}
	at := func(o Outbound, f func(*Outbound)) Outbound { f(&o); return o }
	for _, tc := range []struct {
		name   string
		o      Outbound
		seen   *Seen // nil: no record
		action Action
		until  time.Time
		timed  bool
	}{
		{"ready", base, &Seen{ready, "b"}, CutOver, time.Time{}, false},
		{"handoffs off", at(base, func(o *Outbound) { o.NoHandoff = true }), &Seen{ready, "b"}, Release, time.Time{}, false},
		{"assigned to nobody", at(base, func(o *Outbound) { o.Assignee = "" }), &Seen{ready, "b"}, Release, time.Time{}, false},
		{"no record", base, nil, Wait, since.Add(wait), false},
		{"warming", base, &Seen{with(func(h *storage.Handoff) { h.Phase = storage.HandoffWarming }), "b"}, Wait, since.Add(wait), false},
		{"from another runner", base, &Seen{with(func(h *storage.Handoff) { h.From = "c" }), "b"}, Wait, since.Add(wait), false},
		{"for another epoch", base, &Seen{with(func(h *storage.Handoff) { h.FromEpoch = 39 }), "b"}, Wait, since.Add(wait), false},
		{"to another runner", base, &Seen{with(func(h *storage.Handoff) { h.To = "c" }), "b"}, Wait, since.Add(wait), false},
		{"under another runner's lease", base, &Seen{ready, "c"}, Wait, since.Add(wait), false},
		{"under no live lease", base, &Seen{ready, ""}, Wait, since.Add(wait), false},
		{"ready, retry pending", at(base, func(o *Outbound) { o.CutoverRetryAt = since.Add(3 * time.Second) }), &Seen{ready, "b"}, Wait, since.Add(3 * time.Second), false},
		{"ready, retry due", at(base, func(o *Outbound) { o.CutoverRetryAt = o.Now }), &Seen{ready, "b"}, CutOver, time.Time{}, false},
		{"retry after the wait", at(base, func(o *Outbound) { o.CutoverRetryAt = since.Add(2 * wait) }), &Seen{ready, "b"}, Wait, since.Add(wait), false},
		{"retry past, no record", at(base, func(o *Outbound) { o.CutoverRetryAt = since }), nil, Wait, since.Add(wait), false},
		{"waited HandoffWait", at(base, func(o *Outbound) { o.Now = since.Add(wait) }), nil, Release, time.Time{}, true},
		{"waited, record not ready", at(base, func(o *Outbound) { o.Now = since.Add(wait + 1) }), &Seen{with(func(h *storage.Handoff) { h.Phase = storage.HandoffWarming }), "b"}, Release, time.Time{}, true},
		{"waited, ready", at(base, func(o *Outbound) { o.Now = since.Add(2 * wait) }), &Seen{ready, "b"}, CutOver, time.Time{}, false},
	} {
		asked := false
		d := DecideOutbound(tc.o, func() (Seen, bool) {
			asked = true
			if tc.seen == nil {
				return Seen{}, false
			}
			return *tc.seen, true
		})
		if d.Action != tc.action || !d.Until.Equal(tc.until) || d.TimedOut != tc.timed {
			t.Errorf("%s: DecideOutbound = %v until %v timed out %v; want %v until %v timed out %v",
				tc.name, d.Action, d.Until, d.TimedOut, tc.action, tc.until, tc.timed)
		}
		if asked != !(tc.o.NoHandoff || tc.o.Assignee == "") {
			t.Errorf("%s: record asked for: %v", tc.name, asked)
		}
		if d.Action == CutOver && d.Record != tc.seen.Record {
			t.Errorf("%s: cut over with %+v, want %+v", tc.name, d.Record, tc.seen.Record)
		}
		if asked && d.HasRecord != (tc.seen != nil) {
			t.Errorf("%s: HasRecord %v", tc.name, d.HasRecord)
		}
	}
}

// TestCutoverRetryIn: a cutover called off for running handlers is tried
// again after as long as the drain took, at least the probe interval and
// at most DrainTimeout.
func TestCutoverRetryIn(t *testing.T) {
	const probe, drain = 100 * time.Millisecond, 5 * time.Second
	for _, tc := range []struct{ drained, want time.Duration }{
		{10 * time.Millisecond, probe},
		{time.Second, time.Second},
		{drain, drain},
		{time.Minute, drain},
	} {
		if got := CutoverRetryIn(tc.drained, probe, drain); got != tc.want {
			t.Errorf("CutoverRetryIn(%v, %v, %v) = %v, want %v", tc.drained, probe, drain, got, tc.want)
		}
	}
	if got := CutoverRetryIn(time.Millisecond, time.Second, drain/10); got != drain/10 {
		t.Errorf("CutoverRetryIn with a probe interval above DrainTimeout = %v, want DrainTimeout %v", got, drain/10)
	}
}
