package ownership

import (
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/runner"
)

func TestLastEventsListsEachRunnersLastEvents(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var evs []runner.Event
	for i := range 5 {
		evs = append(evs, runner.ShardAcquired{EventBase: runner.EventBase{Runner: "b", Time: t0.Add(time.Duration(i) * time.Second)}, Shard: 7, Epoch: 10})
	}
	evs = append(evs, runner.Detached{EventBase: runner.EventBase{Runner: "a", Time: t0}, Detail: "cut off"})
	got := LastEvents(evs, 2)
	want := "last 1 of 1 events of runner a:\n  03:04:05.000000 runner.Detached{Reason=" // then its fields
	if !strings.HasPrefix(got, want) || !strings.Contains(got, "Detail=cut off") {
		t.Errorf("LastEvents =\n%s\nwant it to start with %q and name the detail", got, want)
	}
	if !strings.Contains(got, "last 2 of 5 events of runner b:\n  03:04:08.000000 runner.ShardAcquired{Shard=7 Epoch=10}\n  03:04:09.000000") {
		t.Errorf("LastEvents =\n%s\nwant b's last two events", got)
	}
	if got := LastEvents(nil, 3); got != "no runner events recorded" {
		t.Errorf("LastEvents(nil) = %q", got)
	}
}
