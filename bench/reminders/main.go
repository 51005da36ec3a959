// Command reminders measures durable reminders on a real etcd (./bin/etcd,
// started on a free loopback port): the figures of BENCHMARKS.md's
// "Reminders" section.
//
//	go run ./bench/reminders                      # every scenario, default sizes (several minutes)
//	go run ./bench/reminders -scenario register   # one of: register, fire, steady, stored, moves
//
// Scenarios (runners in this process, each with its own etcd client):
//
//   - register: one runner; asks at -rate per second (open loop) whose
//     handlers each register a reminder; the latency of Register (one
//     fenced transaction) p50/p99/max.
//   - fire: one runner; -fire reminders with a 1 s period, due times
//     spread over the second (so -fire fires a second); the fire lag (the
//     handler's start minus the tick's due time) and the fires per second,
//     for each size in -fire (comma-separated).
//   - steady: -runners runners, -steady reminders with a 1 s period; etcd
//     writes (revisions) per second in steady state, fires per second.
//   - stored: -stored reminders written to etcd (due in an hour), the
//     database size, then a cold start of -runners runners: time until
//     every shard is owned and until every reminder is loaded, beside the
//     same cold start without reminders; heap per loaded reminder.
//   - moves: -runners runners, -moving reminders with a 1 s period; a
//     runner joins, one shuts down gracefully, one joins again, one
//     crashes; ticks lost or fired twice, as the fires' numbers tell.
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
	scenario string
	rate     int
	duration time.Duration
	fire     []int
	runners  int
	shards   int
	steady   int
	stored   int
	moving   int
	verbose  bool
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	p := params{}
	fs := flag.NewFlagSet("reminders", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&p.scenario, "scenario", "all", "register, fire, steady, stored, moves or all")
	fs.IntVar(&p.rate, "rate", 1000, "register: registrations a second")
	fs.DurationVar(&p.duration, "duration", 10*time.Second, "register, fire, steady: how long each measures")
	fire := fs.String("fire", "10000,20000,40000", "fire: reminders on the runner (each fires once a second), comma-separated sizes")
	fs.IntVar(&p.runners, "runners", 20, "steady, stored, moves: runners")
	fs.IntVar(&p.shards, "shards", 1024, "NumShards")
	fs.IntVar(&p.steady, "steady", 100000, "steady: reminders with a 1 s period")
	fs.IntVar(&p.stored, "stored", 1000000, "stored: reminders stored")
	fs.IntVar(&p.moving, "moving", 20000, "moves: reminders with a 1 s period")
	fs.BoolVar(&p.verbose, "v", false, "runners' info logs")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	for s := range strings.SplitSeq(*fire, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			fmt.Fprintf(stderr, "reminders: -fire %q: want positive sizes\n", *fire)
			return 2
		}
		p.fire = append(p.fire, n)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	scenarios := map[string]func(context.Context, params, io.Writer) error{
		"register": benchRegister, "fire": benchFire, "steady": benchSteady, "stored": benchStored, "moves": benchMoves,
	}
	order := []string{"register", "fire", "steady", "moves", "stored"}
	return scenario.Run(ctx, "reminders", p.scenario, order, scenarios, p, stdout, stderr)
}
