// Package handoff is the planned-move protocol of DESIGN.md ("Handoff")
// without a runner: the phases of a handoff and their legal transitions,
// on each side, as one state machine, and the protocol's decisions as
// pure functions of what a runner knows.
//
// The protocol: the new owner (the inbound side) writes the shard's
// handoff record at phase warming, warms, and advances the record to
// ready; the old owner (the outbound side) sees ready, stops admission,
// drains, releases its entities and runs ReleaseShard (drained), then
// moves the lock to the new owner in one transaction that also deletes
// the record (cutover). Either side can abort; an old owner that sees no
// usable ready record within HandoffWait releases the shard plainly.
//
// # Guarantees
//
//   - One end per handoff, nothing after it. A handoff ends once (Cutover,
//     Aborted or Acquired); every later report of it, from whatever
//     goroutine, is refused with ErrEnded. So an abort is reported and
//     counted once, and no observer sees a phase after a handoff's end.
//   - Phases in protocol order. Next is the only transition function: the
//     inbound side reports Warming only first and Ready only after it; the
//     outbound side reports Cutover only after Drained (the lock moves
//     only after the drain). Any other transition is refused with
//     ErrIllegal, never applied.
//   - An ended handoff's context is cancelled (Inbound.Advance), so work
//     still running for it (warming, record writes) stops.
//   - The decisions (DecideOutbound, Inbound.Restart, DefiniteTransfer,
//     Transfer.Verdict, CutoverRetryIn) read only their arguments: the
//     same inputs give the same decision, whatever the runner's state.
//
// Package runner makes the store calls, owns the maps of handoffs in
// flight and reports the phases (as runner.HandoffPhase events, whose
// Phase is Phase.String()); it calls this package for every transition
// and decision. This package makes no store call, starts no goroutine and
// never logs.
//
// # Concurrency
//
// An Inbound is safe for concurrent use: its phase and its warmed
// instances are guarded by its own mutex (a leaf: it is never held while
// calling out, except for the report function given to Advance). A
// Machine is not: it belongs to one goroutine (the outbound side's
// cutover). Everything else is a pure function.
package handoff
