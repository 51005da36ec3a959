// Package linearize decides whether what callers observed of register
// entities could have happened on one copy of each entity: it checks a
// history of read, write and compare-and-set operations for
// linearizability with porcupine (github.com/anishathalye/porcupine), one
// entity at a time. The fault suite (bench/faults) and the deterministic
// simulation (runner/simulation_test.go) feed it the histories their
// drivers record. It is test and harness code, never imported by the
// library; a test of your own entities can record its callers' operations
// the same way and check them.
//
// # The model
//
// Every entity is an int64 register that starts at 0. Read returns it;
// Write(v) sets it to v; CAS(e, v) sets it to v and answers swapped when
// it holds e, and otherwise answers not swapped with the value it holds.
//
// # Outcomes
//
// A caller records each operation's invocation and return instants (one
// clock for the whole history: CLOCK_MONOTONIC in the fault suite, virtual
// time in the simulation) and its outcome:
//
//   - OK: the operation took effect once, between Call and Return, with
//     the result recorded;
//   - Failed: it certainly never took effect (an error that guarantees the
//     message reached no handler: see [OutcomeOf]); it is left out;
//   - Unknown: it may have taken effect, at any instant after Call, or
//     never. An unknown write or CAS is checked as pending (porcupine's
//     return instant = +inf): it may be placed anywhere after its
//     invocation, including after every other operation, which is the same
//     as never having happened. An unknown read constrains nothing and is
//     left out.
//
// # Reduction
//
// A pending write or CAS whose value no other operation of the entity
// observed (no read returned it, no CAS answered it or expected it) is
// left out before the search: any linearization of the full history
// becomes one of the reduced history by removing it and moving the
// pending operations that ran while the register held its value to the
// end, and conversely a pending operation can always be placed last. It
// leaves out most unknown writes when writers draw unique values (the
// drivers do); its soundness does not depend on that. This keeps the
// search small when faults leave many operations unknown (etcd's
// robustness tests do the same).
//
// # Bounds and verdicts
//
// Each entity is searched within Config.Timeout. A search that runs out
// of time is reported Unknown, counted apart and never taken for a pass:
// [Report.OK] is false. The first entity found not linearizable is
// written as porcupine's HTML visualization (every operation, the longest
// linearizable prefixes, where each attempt failed) to Config.HTML.
//
// # Concurrency
//
// [Check] is safe for concurrent use; it checks the entities one after the
// other on the calling goroutine (porcupine runs each search on a goroutine
// of its own and waits for it).
package linearize
