package eventhub

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRecentKeepsTheLatestEventsNewestFirst: the ring keeps the last
// RecentEvents events, newest first.
func TestRecentKeepsTheLatestEventsNewestFirst(t *testing.T) {
	var ring ring[int]
	if got := ring.last(10); len(got) != 0 {
		t.Fatalf("empty ring gave %d events", len(got))
	}
	for i := range RecentEvents + 44 {
		ring.add(i)
	}
	got := ring.last(3)
	for i, want := range []int{RecentEvents + 43, RecentEvents + 42, RecentEvents + 41} {
		if got[i] != want {
			t.Errorf("last(3)[%d] = %d, want %d", i, got[i], want)
		}
	}
	all := ring.last(10 * RecentEvents)
	if len(all) != RecentEvents || all[len(all)-1] != 44 {
		t.Errorf("last(all) = %d events ending at %v, want %d ending at 44", len(all), all[len(all)-1], RecentEvents)
	}
}

// TestPublishNeverBlocksOnASlowReader: events queue for a subscriber that
// does not read, and arrive in order once it does.
func TestPublishNeverBlocksOnASlowReader(t *testing.T) {
	var h Hub[int]
	seen := 0
	h.Observe = func(int) { seen++ }
	s := h.Subscribe()
	defer s.Close()
	done := make(chan struct{})
	go func() {
		for i := range 10000 {
			h.Publish(i)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Publish blocked on a subscriber that does not read")
	}
	for want := range 10000 {
		if got := <-s.Events(); got != want {
			t.Fatalf("event %d arrived as %d: out of order", want, got)
		}
	}
	if seen != 10000 {
		t.Errorf("Observe saw %d events, want 10000", seen)
	}
}

// TestClosedSubscriptionGetsNothingMore: Close ends delivery and closes
// the channel.
func TestClosedSubscriptionGetsNothingMore(t *testing.T) {
	var h Hub[string]
	s := h.Subscribe()
	h.Publish("a")
	s.Close()
	s.Close() // idempotent
	h.Publish("b")
	for ev := range s.Events() {
		if ev == "b" {
			t.Fatal("an event published after Close was delivered")
		}
	}
}
