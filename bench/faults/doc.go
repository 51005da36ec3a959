// Command faults proves shardhost's guarantees under randomized faults
// with real processes, the way Jepsen and etcd's robustness suite do: a
// seeded schedule of faults against a real cluster, then a checker over
// the history every process recorded.
//
//	go run ./bench/faults                  # one run, seed from the clock
//	go run ./bench/faults -runs 200        # the documented session (BENCHMARKS.md)
//	go run ./bench/faults -seed 17 -v      # replay one run
//	SHARDHOST_FAULTS_LOG=debug go run ./bench/faults -seed 17 -keep   # with the runners' debug logs kept
//	go run ./bench/faults -kinds pause -faults 6 -runs 20   # one kind of fault only
//	go run ./bench/faults -check-registers DIR/registers.jsonl   # rule 9 again on a kept run's registers
//
// # A run
//
// A 3-member etcd cluster from ./bin (make setup), a toxiproxy server with
// one proxy per (runner, member) pair, Runners runner processes
// (bench/internal/runnerproc: this binary re-executed, one OS process per runner)
// hosting counters, and a client-only gateway in this process whose callers
// ask Inc (and now and then Get) of Entities counters over Shards shards.
// Each Inc handler runs Work (5 ms), adds one, checkpoints the count
// (fenced) every CheckpointEvery increments and in its Release hook. The
// same gateway reads, writes and compare-and-sets Registers registers
// (-registers, 200) at RegisterRate operations a second (-register-rate,
// 150; 40 % reads, 30 % writes of values unique in the run, 30 % CAS
// expecting the last value seen); a register checkpoints every change,
// fenced, before it answers, and restores on activation.
//
// The run draws its schedule from its seed (printed; -seed replays it) and
// injects the faults one after the other, each healed before the next:
// SIGKILL of a runner then a restart with the same ID, SIGSTOP of a runner
// longer than the TTL then SIGCONT, a toxiproxy timeout (black hole),
// latency longer than the TTL or reset_peer on all of one runner's etcd
// links, SIGKILL of the etcd leader then a restart, SIGSTOP of the etcd
// leader for 1-3 s, a graceful Shutdown (SIGTERM) then a restart, and a
// scale-up. After the last fault it waits for the cluster to converge,
// stops the load, reads every counter, stops the runners and reads etcd's
// whole history of the namespace back.
//
// # The history and the checks
//
// Every runner process appends to a file of its own (one write(2) per
// record, so it survives SIGKILL; written before a handler returns) the
// start and end of every handler with its shard, entity, instance, epoch,
// lease and lease deadline, every checkpoint write and its result, every
// activation with the count it restored, every release, and its ownership,
// registration and detach events, and the runs and lives of rule 10's
// always-on work. Times are CLOCK_MONOTONIC, one clock for
// all processes on Linux. The driver records every ask and its answer
// (value, epoch, process, instance) or error. The checker (check.go) then
// demands:
//
//  1. single writer: no two handler executions of a shard by different
//     (process, epoch) overlap in time — except a handler its process was
//     frozen in (SIGSTOP), which finishes after it resumes (physics); such
//     a late handler's result must not be acknowledged (5);
//  2. the epochs of a shard's successive owners strictly increase;
//  3. no checkpoint accepted by etcd under an epoch that was not the shard
//     lock's at that revision (read back from etcd's history, not from
//     what the runners say);
//  4. every acknowledged increment is in the state the next instance of
//     its counter restores after a planned move (0 lost); after a crash or
//     detach only what was not yet checkpointed is lost (counted), never a
//     checkpointed value; no two increments of one instance acknowledged
//     with the same value (the next instance is the next activation under
//     a newer epoch: one under an older epoch is a frozen process resuming
//     mid-activation, counted, and it must run no handler);
//  5. no acknowledged result from a handler that ended after a newer epoch
//     of its shard had started serving the counter; every reply matches a
//     handler execution;
//  6. no handler started after its runner's detach instant (lease deadline
//     - margin) or after its lease expired on the server (seen by an
//     observer's watch), and every runner alive when its lease expired had
//     detached before — its detach instant, deadline - margin, precedes the
//     expiry;
//  7. the cluster re-converges (every shard locked by a live runner, no
//     handoff pending, all runners attached and agreeing on the
//     assignment, one counter of every shard answering) within 2 x TTL
//     after the last fault was healed, and every counter and register
//     answers the final read (no hang, no stuck shard); a restarted runner
//     registers;
//  8. reminders: the first 200 counters (-reminders) register a reminder
//     firing every second before the faults, and each tick's handler
//     records its tick (between a start and an end record, so checks 1 and
//     6 apply to it too). Every tick fired on the owner of its shard,
//     inside that ownership by the runners' own records; a reminder's
//     ticks never go backwards (a tick counts as fired when the start gate
//     admits it: one whose handler's first record came right after a
//     SIGSTOP of its process, within frozenBeforeStart of the resume, is
//     placed at the stop, as checks 1 and 6 judge it — the next owner may
//     meanwhile have fired it again, redelivered); a tick not marked redelivered follows the
//     previous one exactly (its missed count explains any gap: a planned
//     move loses and repeats nothing); a redelivered tick stands for every
//     tick after the previous fire (at least once) and follows an
//     unplanned loss of the shard (a SIGKILL or SIGSTOP of its owner, a
//     detach, a lost lock, a release that could not record its progress);
//     every reminder fires again within one period plus 1 s + OpTimeout
//     after the cluster re-converged (the reminders' liveness rule), and
//     within 2 x TTL of a SIGKILL of the runner it fired on (which the
//     schedule restarts with the same ID at once: its shards wait for the
//     old lease to expire, then for the new process);
//  9. every register's history is linearizable: what the callers observed
//     could have happened on one copy of each register, in an order that
//     respects real time (runner/runnertest/linearize, with porcupine). The driver
//     records each operation's invocation and return (CLOCK_MONOTONIC)
//     and its outcome: ok; failed, for the errors that prove no handler
//     ran it (not owner, undelivered, no owner, not sent, ...); or unknown
//     — ErrMaybeDelivered, a StaleResultError, a handler error, a deadline
//     — which may have taken effect at any instant after its invocation or
//     never (linearize.OutcomeOf). Each register's search is bounded (30 s);
//     one that runs out is a violation (undecided, never a pass). The
//     visualization of the first register found not linearizable is kept
//     in the run's directory (linearizability.html);
//  10. always-on work (check_always.go): every runner runs Singletons
//     singletons (-singletons, 4) and a shard worker, whose bodies record
//     their start and their return (when their context ends), and hosts a
//     remembered kind whose Keepers entities (-keepers, 16; one ask each
//     before the faults) record each life, from Activate to Release or
//     the end of their context; right before each graceful stop the
//     driver touches one more, fresh, on a shard the stopping runner
//     owns, so that its marker's put is likely still queued when the
//     release begins. A run (life) cut by SIGKILL
//     has no end record: it ends at the kill. No two runs of a singleton
//     or of one shard's worker, and no two lives of a keeper, overlap in
//     time — except when the older one's process was frozen (SIGSTOP)
//     before the newer started, its runner's detach instant (lease
//     deadline - margin) came during the freeze, it returned within 1 s
//     of the SIGCONT and the newer runs under a higher epoch: such a
//     "fenced-only" overlap is counted, not a violation, because the
//     guarantee (docs/always-on.md) is never two at once among instances that
//     honour their context, and a frozen process honours nothing — which
//     is what Work.Epoch, the fencing token, is for (the newer epoch's
//     writes make the older's refusable). Every run and life starts inside
//     its process's ownership of its shard at its epoch (the runners' own
//     records, 50 ms either side). After every run or life interrupted by
//     a SIGKILL (from the kill), a SIGSTOP (from the stop), a planned move
//     or shutdown, a detach or a lost lock (from its return, or from the
//     heal of the fault then in progress if later: a runner whose links
//     are slow keeps its lease alive on the server, and its shards wait
//     for it to re-attach) the thing runs again, on its shard's next
//     owner, within 2 x TTL (the bound of check 8: a killed runner
//     restarts with its ID at once, so its shards wait for the old lease,
//     then for the new process); the summary gives each distribution.
//     When the session stops (the cluster converged), every singleton,
//     every shard's worker and every keeper runs exactly once, on the
//     process owning its shard then — a keeper touched before a graceful
//     stop too, unless the ownership that answered its touch ended
//     otherwise than by a release, or its release recorded nothing
//     (RemindersUnrecorded): the marker may then be lost with the shard,
//     and that keeper need not run again (counted apart).
//
// A violation makes the run fail; its files (histories, runner logs, etcd
// and toxiproxy logs) are kept and their directory printed. The summary
// counts faults by kind, SIGSTOPs that caught a handler running and late
// handlers withheld, asks by outcome and error class, increments lost,
// fenced and accepted writes, detach margins, convergence times, the
// register operations checked for linearizability and how long it took,
// and the always-on runs and lives, fenced-only overlaps and how soon each
// always-on thing ran again by cause (p50 / p99 / max); the
// command exits 1 on any violation or on a run that could not be carried
// out.
//
// The runtime checks the detach instant, then calls the handler, which
// records its start: a handler admitted just before the instant may record
// a start up to 50 ms after it; check 6 allows that only when its result
// was not acknowledged (the owner's check after the handler withholds it),
// and the summary counts them.
//
// A handler whose start falls right after its process resumed from a
// SIGSTOP is not judged by check 6 (the stop may have fallen between the
// runner's admission check and the handler's first record); the summary
// counts them.
//
// `make test` runs one fixed seed whose nine faults are one of each kind
// (TestRandomizedFaultsKeepEveryGuarantee), without -race:
//
//	go run ./bench/faults -seed 47685 -faults 9 -v
//
// A failed run prints its violations, the command that replays it and the
// last events of each runner process. A timing bound (convergence, running
// again, a handler's first record after its admission) missed by no more
// than a process involved was measured unscheduled meanwhile (stall probes
// in every runner process and the driver: testenv.ProbeStalls) is listed
// under STARVED and does not fail the run; any other miss, and every
// guarantee that does not depend on scheduling, does.
package main
