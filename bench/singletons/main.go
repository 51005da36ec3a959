// Command singletons measures singletons and remembered entities on a real
// etcd (./bin/etcd, started on a free loopback port): the figures of
// BENCHMARKS.md's "Singletons and remembered entities" section.
//
//	go run ./bench/singletons                      # every scenario, default sizes (about 2 minutes)
//	go run ./bench/singletons -scenario handover   # one of: handover, crash, restart, writes
//
// Scenarios (runners in this process, each with its own etcd client; the
// crash scenario's SIGKILL victim in a child process):
//
//   - handover: -runners runners, -singletons singletons registered on
//     every runner, each recording its own start and return, and
//     -handover-remembered remembered entities; -rounds rounds of planned
//     moves (a runner joins, then the oldest leaves with Shutdown): the
//     singleton handover gap (the new instance's start minus the old
//     one's return) p50/p99/max over every handover, its parts (old
//     return -> ShardReleased on the old owner -> cutover -> ShardAcquired
//     on the new one -> new start), the instances that overlapped (must
//     be 0); the same for the remembered entities (old Release -> new
//     Activate). With -busy, callers keep handlers of -busy-handler
//     running meanwhile (a drain lets them finish).
//   - crash: -runners runners, the singletons and -crash-remembered
//     remembered entities; a runner stops abruptly -repeat times per mode
//     in -crash (close: Runner.Close in this process, no release, the
//     lease runs out; kill: SIGKILL of a runner in a child process), then
//     a runner joins in its place: the time from the stop until the
//     victim's singletons and remembered entities run again on the
//     survivors, beside the lease deletion of the victim's locks.
//   - restart: -restart remembered entities stored in one shard, then a
//     cold start of one runner: from ShardAcquired of that shard until
//     every entity's Activate ran, for each rate in -rates (0: the default
//     RememberedStartRate).
//   - writes: -runners runners; etcd revisions (one per write) caused by
//     activating -entities remembered entities (one message each), by
//     -messages messages to them, by planned moves of every shard (as many
//     runners join, the old ones shut down), and the writes that touched
//     remembered/ keys in each phase (a watch).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shardhost/shardhost/bench/internal/scenario"
)

type params struct {
	scenario        string
	runners         int
	shards          int
	singletons      int
	rounds          int
	handRemembered  int
	busy            int
	busyHandler     time.Duration
	repeat          int
	crash           []string
	crashRemembered int
	restart         int
	restartShard    int
	rates           []int
	entities        int
	messages        int
	ttl             time.Duration
	quiet           time.Duration
	startRate       int // RememberedStartRate of every runner (0: default)
	verbose         bool
}

func main() {
	childMain() // a crash scenario's runner process
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	p := params{}
	fs := flag.NewFlagSet("singletons", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&p.scenario, "scenario", "all", "handover, crash, restart, writes or all")
	fs.IntVar(&p.runners, "runners", 3, "handover, crash, writes: runners")
	fs.IntVar(&p.shards, "shards", 1024, "NumShards")
	fs.IntVar(&p.singletons, "singletons", 20, "handover, crash: singletons registered on every runner")
	fs.IntVar(&p.rounds, "rounds", 10, "handover: rounds of planned moves (a join, then a graceful shutdown)")
	fs.IntVar(&p.handRemembered, "handover-remembered", 3000, "handover: remembered entities spread over the shards")
	fs.IntVar(&p.busy, "busy", 0, "handover: callers asking ordinary entities for -busy-handler of work each, one ask after the other (0: none); the runners then serve gRPC on loopback")
	fs.DurationVar(&p.busyHandler, "busy-handler", 100*time.Millisecond, "handover: how long each -busy ask's handler runs")
	fs.IntVar(&p.repeat, "repeat", 5, "crash: stops per mode")
	crash := fs.String("crash", "close,kill", "crash: modes, comma-separated: close (Runner.Close in this process), kill (SIGKILL of a child process)")
	fs.IntVar(&p.crashRemembered, "crash-remembered", 3000, "crash: remembered entities spread over the shards")
	fs.IntVar(&p.restart, "restart", 10000, "restart: remembered entities stored in one shard")
	fs.IntVar(&p.restartShard, "restart-shard", 7, "restart: that shard")
	rates := fs.String("rates", "0,5000", "restart: RememberedStartRate values, comma-separated (0: the default)")
	fs.IntVar(&p.entities, "entities", 10000, "writes: remembered entities activated")
	fs.IntVar(&p.messages, "messages", 100000, "writes: messages to them")
	fs.DurationVar(&p.ttl, "ttl", 0, "LeaseTTL of every runner (0: the default, 5s)")
	fs.DurationVar(&p.quiet, "quiet", time.Second, "writes: a phase is over once etcd's revision stayed the same this long")
	fs.BoolVar(&p.verbose, "v", false, "runners' info logs")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	for s := range strings.SplitSeq(*crash, ",") {
		if s = strings.TrimSpace(s); s != "close" && s != "kill" {
			fmt.Fprintf(stderr, "singletons: -crash %q: want close and/or kill\n", *crash)
			return 2
		}
		p.crash = append(p.crash, strings.TrimSpace(s))
	}
	for s := range strings.SplitSeq(*rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			fmt.Fprintf(stderr, "singletons: -rates %q: want rates >= 0\n", *rates)
			return 2
		}
		p.rates = append(p.rates, n)
	}
	switch {
	case p.runners < 2:
		fmt.Fprintln(stderr, "singletons: -runners: want at least 2")
		return 2
	case p.shards < 1 || p.singletons < 1 || p.rounds < 1 || p.repeat < 1 || p.restart < 1 || p.entities < 1 || p.restartShard < 0 || p.handRemembered < 0 || p.busy < 0 || p.busyHandler <= 0 || p.messages < 0 || p.crashRemembered < 0 || p.quiet <= 0:
		fmt.Fprintln(stderr, "singletons: -shards, -singletons, -rounds, -repeat, -restart, -entities, -quiet: want positive values")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	scenarios := map[string]func(context.Context, params, io.Writer) error{
		"handover": benchHandover, "crash": benchCrash, "restart": benchRestart, "writes": benchWrites,
	}
	order := []string{"handover", "crash", "restart", "writes"}
	return scenario.Run(ctx, "singletons", p.scenario, order, scenarios, p, stdout, stderr)
}
