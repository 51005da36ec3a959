// Package schedule is a runner's one timer structure: every entity timer
// and every loaded reminder of a runner is an Entry in one Scheduler, a
// binary heap by due time fired from a single goroutine — no goroutine and
// no runtime timer per entry, so millions of entries cost their memory and
// O(log n) per operation. Entries overdue when they were loaded (a cold
// start, a takeover after a crash) go through a FIFO catch-up queue fired at
// a bounded rate, so a restart is no thundering herd.
//
// Guarantees: an entry fires at most once per Schedule/CatchUp call, never
// before its due time on the monotonic clock, in due-time order; an entry
// stopped or rescheduled before it was popped does not fire for its old
// time. Fire runs on the scheduler goroutine outside the scheduler's lock
// and must not block. Owners keep their own "cancelled" state: an entry
// being fired has already left the schedule, so Stop cannot catch it.
//
// Schedule, CatchUp, Stop and Len are safe for concurrent use. The package
// makes no store call, logs nothing and works inside testing/synctest.
package schedule
