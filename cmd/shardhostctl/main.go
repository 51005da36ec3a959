// Command shardhostctl inspects and steers a shardhost cluster by reading
// and writing its keys in etcd directly, so it works when no runner is up.
//
//	shardhostctl [flags] status [-wait balanced|owned [-wait-timeout D]]
//	                                            runners, shard counts, unowned shards, handoffs
//	shardhostctl [flags] shards [-owner R] [-unowned] [-handoffs] [-range A-B]
//	                                            owner and epoch of each shard
//	shardhostctl [flags] drain RUNNER [-wait]   RUNNER takes no shard: they move away by handoff
//	shardhostctl [flags] undrain RUNNER         withdraw the request: RUNNER takes shards again
//	shardhostctl [flags] where KIND ID          the shard and owner of an entity
//	shardhostctl [flags] plan join RUNNER [-weight W] | leave RUNNER | drain RUNNER | weight RUNNER W
//	                                            dry run of the assignment after that change
//	shardhostctl [flags] singletons             where each singleton runs, since when
//	shardhostctl [flags] remembered [-forget KIND/ID]
//	                                            remembered entities per shard
//	shardhostctl [flags] reminders              reminders stored per shard
//
// Flags (before or after the command):
//
//	-endpoints host:port[,host:port]  etcd ($SHARDHOST_ETCD, default 127.0.0.1:2379)
//	-namespace NAME                   the cluster's namespace ($SHARDHOST_NAMESPACE; when
//	                                  empty and etcd holds exactly one, that one)
//	-shards N                         override the cluster's NumShards ($SHARDHOST_SHARDS); by
//	                                  default the cluster record's (see below), else 1024
//	-timeout D                        bound on each etcd call (default 5s)
//	-json                             print JSON instead of tables
//
// TLS and authentication, named as etcdctl names them:
//
//	-cacert FILE                      verify etcd's certificate with this CA ($SHARDHOST_ETCD_CACERT)
//	-cert FILE, -key FILE             client certificate and key ($SHARDHOST_ETCD_CERT, $SHARDHOST_ETCD_KEY)
//	-insecure-skip-tls-verify         TLS without verifying etcd's certificate, for tests
//	                                  ($SHARDHOST_ETCD_INSECURE_SKIP_TLS_VERIFY)
//	-user NAME[:PASSWORD]             etcd user ($SHARDHOST_ETCD_USER)
//	-password PASSWORD                its password ($SHARDHOST_ETCD_PASSWORD; the variable
//	                                  is safer than the flag)
//
// A user whose role is limited to the namespace's prefix cannot list the
// other namespaces: give -namespace. status, shards, where and plan need
// read on "/{namespace}/" (singletons, remembered and reminders too), drain
// and undrain readwrite, remembered -forget write on remembered/ (see
// SECURITY.md).
//
// # What is stored, with no runner up
//
// singletons, remembered and reminders list the stored records whether or
// not a runner is registered (with none, every shard has no owner). An
// owner whose lease is not renewed (a killed runner) is shown with the
// seconds etcd gives its lease: "lease ends in 2 s: not renewed".
// remembered -forget KIND/ID deletes one marker only while the entity's
// shard has no lock, conditional on that in the same transaction: an owner
// keeps its remembered entities running from memory, so the command
// refuses while one owns the shard (forget the entity from its handler,
// entity.Forget).
//
// # Waiting
//
// status -wait balanced returns once every shard is owned by the runner
// the cluster's strategy assigns it to, with no handoff in flight; -wait
// owned once every shard is owned by a registered runner. Past
// -wait-timeout (2 minutes) it exits 1 saying what is missing.
// When etcd cannot be reached the error says what a TLS handshake with the
// first endpoint found (an unknown CA, a missing client certificate, TLS
// on one side only).
//
// # Shard count and strategy
//
// The first runner of a cluster publishes its NumShards and strategy in the
// cluster record, {namespace}/cluster, and every later runner must agree
// with it. shardhostctl reads them from there: shard numbers (where), counts
// (status) and plans use the cluster's own values. -shards overrides the
// record with a warning on stderr when they differ; without a record (no
// runner started yet) the count is -shards, else 1024, with a note saying
// so.
//
// # Drain
//
// drain writes a drain request, drains/{RUNNER} in the namespace, a key
// without a lease. The runner with that ID follows its own request: while
// the key exists it publishes its record with Draining set (its weight
// kept), every runner assigns a draining runner no shard, and its shards
// move to the others by handoff (the new owner warms, the old one drains
// in-flight messages and transfers the lock): the graceful path of a
// planned move. undrain deletes the key and the runner takes shards again.
// The request is kept apart from the runner record on purpose: the record
// belongs to the runner (it rewrites foreign changes to it) and dies with
// its lease, while the request outlives the runner's processes, so a
// drained runner that restarts, loses its lease or re-attaches after a
// detach registers drained again; a runner can also be drained before it
// starts. drain refuses to drain the last runner that can take shards
// unless -force.
//
// # Plan
//
// plan computes, without writing anything, the assignment the runners
// would compute after a change — a runner joins (with -weight), leaves
// (shut down or crashed), is drained, or changes weight — exactly as they
// compute it: the registered runners with their weights (a draining one
// counting as weight 0), the cluster record's strategy and, for a strategy
// that keeps shards where they are (sticky-balanced), each shard's owner
// from its lock. It prints each runner's shards owned now and assigned
// after, and the shards that move from their owner now to their assignee
// after (text: per pair of runners; -json: every shard and the whole
// assignment). A settled cluster then does what the plan says; one that
// is still moving shards starts from where its locks are.
//
// Exit status: 0 on success and for -h/-help/--help and `help` (usage on
// stdout), 1 when etcd cannot be reached or the request fails, 2 on a usage
// error (usage on stderr).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}
