package hosting

import (
	"fmt"
	"testing"
)

// TestTickWithdrawnByItsDoneNeverRuns: a reminder tick waits in its
// entity's mailbox behind a running handler; when the entity reaches it,
// done(true) — the reminder set's word — decides. A set that stopped or
// paused meanwhile answers false: the tick's handler never runs here. A
// set still firing answers true: it runs. done is called once either way.
func TestTickWithdrawnByItsDoneNeverRuns(t *testing.T) {
	for _, mayRun := range []bool{false, true} {
		t.Run(fmt.Sprintf("done answers %v", mayRun), func(t *testing.T) {
			f := newFixture(t, 0)
			open := newGate(t)
			first := f.askAsync(t, "a") // a's handler runs, blocked at the gate
			var calls []bool
			done := func(started bool) bool {
				calls = append(calls, started) // a's goroutine only
				return mayRun
			}
			if !f.shard.Fire(f.kind, f.work, "a", workReq{Block: true}, done) {
				t.Fatal("the tick was not admitted")
			}
			waitQueued(t, f, "a", 1)
			open()
			wait(t, first, "the running ask")
			if res := f.ask("a", false); res.Err != nil { // behind the tick: it was processed
				t.Fatalf("ask after the tick = %+v", res)
			}
			ran := len(started) // the tick's handler says it started, and passes the open gate
			for range ran {
				<-started
			}
			if len(calls) != 1 || !calls[0] {
				t.Fatalf("done called with %v, want once with true", calls)
			}
			if want := map[bool]int{false: 0, true: 1}[mayRun]; ran != want {
				t.Errorf("the tick's handler ran %d times with done answering %v, want %d", ran, mayRun, want)
			}
		})
	}
}
