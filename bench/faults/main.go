// Command faults runs shardhost under randomized faults with real
// processes and checks the history they leave: see doc.go.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
)

func main() {
	runnerproc.Main() // a runner child: runs and exits
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	p := defaultParams()
	fs := flag.NewFlagSet("faults", flag.ContinueOnError)
	fs.SetOutput(stderr)
	runs := fs.Int("runs", 1, "randomized runs")
	seed := fs.Uint64("seed", 0, "seed of the first run (run i uses seed+i); 0: from the clock")
	kinds := fs.String("kinds", "", "comma-separated fault kinds to draw from (default all: "+strings.Join(faultKinds, ",")+")")
	verbose := fs.Bool("v", false, "print each fault as it is injected")
	recheck := fs.String("check-registers", "", "check the register history a run kept (registers.jsonl) again, and exit")
	fs.IntVar(&p.Faults, "faults", p.Faults, "faults per run")
	fs.IntVar(&p.Runners, "runners", p.Runners, "runner processes at the start")
	fs.IntVar(&p.Shards, "shards", p.Shards, "NumShards")
	fs.IntVar(&p.Entities, "entities", p.Entities, "counters the driver addresses")
	fs.IntVar(&p.Rate, "rate", p.Rate, "asks a second (open loop: each on its own goroutine)")
	fs.IntVar(&p.MaxInFlight, "max-in-flight", p.MaxInFlight, "asks waiting at once, at most (more are shed)")
	fs.IntVar(&p.CheckpointEvery, "checkpoint-every", p.CheckpointEvery, "a counter checkpoints every this many increments (and on release)")
	fs.IntVar(&p.Registers, "registers", p.Registers, "registers the driver addresses (their histories are checked for linearizability)")
	fs.IntVar(&p.RegisterRate, "register-rate", p.RegisterRate, "register operations a second (open loop); 0: none")
	fs.DurationVar(&p.TTL, "ttl", p.TTL, "runners' LeaseTTL")
	fs.DurationVar(&p.Work, "work", p.Work, "how long each increment's handler runs")
	fs.DurationVar(&p.AskTimeout, "ask-timeout", p.AskTimeout, "each ask's deadline")
	fs.IntVar(&p.Reminders, "reminders", p.Reminders, "counters that register a periodic reminder (every second) before the faults")
	fs.IntVar(&p.Singletons, "singletons", p.Singletons, "singletons every runner runs, beside one shard worker (rule 10)")
	fs.IntVar(&p.Keepers, "keepers", p.Keepers, "remembered entities activated once before the faults (rule 10)")
	fs.StringVar(&p.Dir, "dir", "", "where runs keep their files (default: the temp dir)")
	fs.BoolVar(&p.Keep, "keep", false, "keep every run's files (a failed run's are always kept)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *recheck != "" {
		if err := checkRegistersFile(*recheck, stdout); err != nil {
			fmt.Fprintf(stderr, "faults: %v\n", err)
			return 1
		}
		return 0
	}
	if *kinds != "" {
		for k := range strings.SplitSeq(*kinds, ",") {
			if !slices.Contains(faultKinds, k) {
				fmt.Fprintf(stderr, "faults: unknown fault kind %q (known: %s)\n", k, strings.Join(faultKinds, ","))
				return 2
			}
			p.Kinds = append(p.Kinds, k)
		}
	}
	if *runs < 1 || p.Faults < 1 || p.Runners < 2 || p.Shards < 1 || p.Entities < 1 || p.Rate < 1 || p.MaxInFlight < 1 || p.TTL < time.Second {
		fmt.Fprintln(stderr, "faults: -runs, -faults, -shards, -entities, -rate, -max-in-flight must be positive, -runners at least 2, -ttl at least 1s")
		return 2
	}
	if p.Singletons < 0 || p.Keepers < 0 {
		fmt.Fprintln(stderr, "faults: -singletons and -keepers must not be negative")
		return 2
	}
	if p.Registers < 0 || p.RegisterRate < 0 || (p.RegisterRate > 0 && p.Registers == 0) {
		fmt.Fprintln(stderr, "faults: -registers and -register-rate must not be negative, and -registers positive when -register-rate is")
		return 2
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano() % 1e6)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, args ...any) {
		if *verbose {
			fmt.Fprintf(stderr, format+"\n", args...)
		}
	}
	// The flags that replay one run: those given, but -runs and -seed.
	var replay []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "runs" && f.Name != "seed" && f.Name != "v" && f.Name != "dir" {
			replay = append(replay, fmt.Sprintf("-%s=%s", f.Name, f.Value))
		}
	})
	sum := newSummary(p)
	for i := range *runs {
		s := *seed + uint64(i)
		fmt.Fprintf(stderr, "run %d/%d seed %d: %s\n", i+1, *runs, s, scheduleString(schedule(s, p.Faults, p)))
		res := runOnce(ctx, s, p, logf)
		sum.add(res)
		fmt.Fprintln(stderr, "  "+res.line())
		for _, v := range res.Violations {
			fmt.Fprintln(stderr, "  VIOLATION: "+v)
		}
		if res.failed() {
			fmt.Fprintf(stderr, "  replay: go run ./bench/faults -seed %d %s -v\n", s, strings.Join(replay, " "))
			if res.Tail != "" {
				fmt.Fprint(stderr, res.Tail)
			}
		}
		if ctx.Err() != nil {
			break
		}
	}
	sum.print(stdout)
	if sum.failed() {
		return 1
	}
	return 0
}
