// Package testenv starts real infrastructure for tests: etcd servers (one
// member or a cluster) and a toxiproxy server, each as a child process of the
// test binary, on loopback addresses only.
//
// The binaries are the pinned ones in the repository's bin/ directory
// (etcd v3.6.16, toxiproxy-server v2.12.0), built by running `make setup` in
// the repository root. An etcd or toxiproxy found on PATH is never used. Set
// SHARDHOST_BIN to use another directory. A test that needs a missing binary
// fails (it does not skip).
//
// # Lifetime
//
// Everything a helper starts is tied to the testing.TB it was given: child
// processes are stopped (SIGTERM, then SIGKILL after a bound) and reaped, and
// clients are closed, in t.Cleanup. Data directories and logs live in
// t.TempDir(). When the test has failed, the tail of each process's log is
// printed with t.Logf. Every wait is bounded; a helper that cannot get its
// process ready calls t.Fatalf with the process log's tail.
//
// Programs that are not tests (the churn harness in bench/churn) use the
// entry points that take no testing.TB: [BinaryPath] and [LaunchEtcd], which
// return errors (with the log's tail) instead of failing a test and leave
// the member's lifetime to the caller ([Etcd.Close]).
//
// On Linux the children are started with a parent-death signal (SIGKILL), so
// a test binary that dies without running its cleanups (a panic, a
// `go test -timeout` abort) does not leave servers behind.
//
// # Short mode and failures
//
// Under `go test -short` (the quick loop, `make test-short`) the helpers
// that start a process ([StartEtcd], [StartEtcdCluster],
// [StartProxiedEtcdCluster], [StartToxiproxy], [Chromium]) skip the test
// instead; [SkipIfShort] does the same for other real-time tests.
// [OnFailure] makes a failed test print the command that replays it alone
// ([ReplayCommand]) and a report of the test's choosing.
//
// # Concurrency
//
// The methods of [Etcd], [EtcdCluster], [Toxiproxy] and [Proxy] are safe to
// call from several goroutines, but a member's lifecycle calls (Kill, Stop,
// Restart, Pause, Resume) are meant to come from one test goroutine at a time.
// Helpers that take a testing.TB call its Fatalf and so must run on the test's
// goroutine.
//
// # Timing
//
// Members run with --heartbeat-interval 50 --election-timeout 500 (see
// [WithRaftTiming]) so that a new leader is elected in about a second after
// the old one is killed (the first write succeeds 0.5-0.8 s after SIGKILL of
// the leader). On a 2-core machine a single member is ready in 0.1-0.6 s, a
// 3-member cluster in 0.3-2.5 s, and toxiproxy in about 30 ms. Cleanup of a
// single member takes milliseconds; of a cluster, about 1 s (see
// [EtcdCluster]).
package testenv
