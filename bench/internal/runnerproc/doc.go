// Package runnerproc runs a shardhost runner in a child process of its own,
// so that tests and harnesses can crash it (SIGKILL), freeze it (SIGSTOP)
// or stop it gracefully (SIGTERM), which a runner inside the test process
// cannot model: Close still runs code, and a frozen test process freezes
// the test too.
//
// # How
//
// The child is the calling program itself, re-executed ([os.Executable])
// with the [Spec] in an environment variable. The program must call [Main]
// first thing in TestMain (tests) or main (commands): in the child, Main
// runs the runner and exits; in any other process it returns at once.
//
//	func TestMain(m *testing.M) {
//		runnerproc.Main()
//		goleak.VerifyTestMain(m)
//	}
//
// The child connects to the etcd endpoints of the spec with the recommended
// client settings (etcd.ClientConfig), hosts the entity kind [Kind] (method
// [Echo] answers with the runner, shard and epoch that served the call, so
// callers see where their asks ran), the fault suite's entities — [Counter]
// and [Register], whose every change is checkpointed before it answers,
// and [Keeper], a remembered kind whose instances record each life — runs
// the singletons and shard worker the spec asks for (Spec.Singletons,
// Spec.ShardWorker), whose bodies record each run, and prints one JSON
// [Event] per line on
// its standard output: every runner event (shard acquired, released, lost,
// registered, detached, re-attached, handoff phases), each change of its
// lease deadline (one per acknowledged renewal) and, optionally, every
// DELETE its own watch of the runner and lock keys delivers. Its log
// (log/slog text) goes to standard error; [Proc.Stderr] keeps the tail.
//
// The parent side, [Start], starts a child, waits until it has registered,
// collects its events ([Proc.Events], [Proc.WaitFor]) and controls it
// ([Proc.Kill], [Proc.Pause], [Proc.Resume], [Proc.Stop]).
//
// # Clocks
//
// Event times are the child's wall clock, with nanoseconds: parent and
// child run on the same machine and read the same clock, so the times of
// events of different processes can be compared (to about a microsecond,
// unless the clock is stepped meanwhile). Tests should still decide safety
// by etcd revisions (epochs), and use times only for measurements.
//
// # Lifetime
//
// On Linux a child gets SIGKILL when the parent dies. A child that loses
// its standard output (the parent stopped reading) keeps running until it
// is signalled. A graceful stop (SIGTERM, [Proc.Stop]) runs the runner's
// Shutdown: shards are handed off or released and the lease is revoked.
//
// # Concurrency
//
// The methods of [Proc] are safe for concurrent use.
package runnerproc
