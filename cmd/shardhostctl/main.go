// Command shardhostctl inspects and steers a shardhost cluster by reading
// and writing its keys in etcd directly, so it works when no runner is up.
//
//	shardhostctl [flags] status                 runners, shard counts, unowned shards, handoffs
//	shardhostctl [flags] shards [-owner R] [-unowned] [-handoffs] [-range A-B]
//	                                            owner and epoch of each shard
//	shardhostctl [flags] drain RUNNER [-wait]   move RUNNER's shards away (graceful handoffs)
//	shardhostctl [flags] undrain RUNNER         let RUNNER take shards again
//	shardhostctl [flags] where KIND ID          the shard and owner of an entity
//
// Flags (before or after the command):
//
//	-endpoints host:port[,host:port]  etcd ($SHARDHOST_ETCD, default 127.0.0.1:2379)
//	-namespace NAME                   the cluster's namespace ($SHARDHOST_NAMESPACE; when
//	                                  empty and etcd holds exactly one, that one)
//	-shards N                         NumShards of the cluster ($SHARDHOST_SHARDS, default 1024)
//	-timeout D                        bound on each etcd call (default 5s)
//	-json                             print JSON instead of tables
//
// # Drain
//
// drain marks the runner's record in etcd as draining (Draining: true, its
// weight kept), compare-and-swapped on the record's revision and under the
// record's own lease. Every runner computes the assignment with a draining
// runner at weight 0, so its shards move to the others by handoff (the new
// owner warms, the old one drains in-flight messages and transfers the
// lock): the graceful path, with no failed request. undrain clears the
// mark. The mark lives in the record, so it lasts until undrain or until
// the runner writes a new record: a restart (new incarnation), a lost lease
// or a re-attach after a detach register it afresh, undrained. A runner
// with weight 0 that is draining is shutting down by itself: undrain
// refuses it.
//
// Exit status: 0 on success, 1 when etcd cannot be reached or the request
// fails, 2 on a usage error.
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
