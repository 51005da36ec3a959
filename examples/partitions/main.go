// Command partitions is a demo of warming during a handoff and of shard
// workers. Shards are the partitions of an append-only log (think Kafka);
// a runner runs one consumer per partition it owns (runner.RunPerShard)
// that applies the partition to a materialized view, and answers reads
// from it once the view holds every record appended before the read: a
// new owner that starts cold makes its first reads wait for a full replay.
//
// It scales a cluster from 2 to 3 runners under read and write traffic
// twice, on an embedded etcd by default: with handoff (the new owner warms
// its views in Config.WarmShard while the old owner still serves, then the
// shard cuts over) and with Config.DisableHandoff (plain release and
// acquire: the new owner starts cold). It prints the read latencies and
// replays of both and compares them.
//
//	cd examples && go run ./partitions [-etcd host:port] [-duration 3s] [-v]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/examples/internal/demo"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

const (
	numShards = 16 // = partitions
	leaseTTL  = 5 * time.Second
	// moveTail extends the move window past the instant the 3 runners
	// owned all shards: it covers the first reads on the new owners.
	moveTail = time.Second
)

type options struct {
	etcd        string        // existing etcd endpoint; "" starts an embedded one
	steady      time.Duration // traffic before runner-3 joins
	after       time.Duration // traffic after the cluster settled on 3 runners
	history     int           // records in each partition at the start
	perRecord   time.Duration // simulated cost of consuming one record
	rate        int           // records appended per second to each partition
	keysPerPart int
	readers     int
	verbose     bool
	out         io.Writer // the report
	logs        io.Writer // the runners' logs
}

func defaults() options {
	return options{steady: 2 * time.Second, after: 3 * time.Second, history: 10000, perRecord: 25 * time.Microsecond,
		rate: 200, keysPerPart: 12, readers: 8, out: os.Stdout, logs: os.Stderr}
}

func main() {
	o := defaults()
	demo.RegisterFlags(&o.etcd, &o.verbose)
	flag.DurationVar(&o.after, "duration", o.after, "traffic `time` after the scale-up settled, in each scenario")
	flag.IntVar(&o.history, "history", o.history, "`records` in each partition at the start")
	flag.DurationVar(&o.perRecord, "record-cost", o.perRecord, "simulated `time` to consume one record")
	demo.Main("partitions", func(ctx context.Context) (bool, error) {
		s, err := run(ctx, o)
		return err == nil && len(s.Problems) > 0, err
	})
}

// scenario is what one scale-up showed.
type scenario struct {
	Name    string
	Handoff bool

	StartSettle time.Duration // runner-1 and runner-2 owned all shards
	FirstCold   int           // partitions whose first read waited for a replay of their log
	FirstMax    time.Duration // slowest of those first reads
	Steady      stats         // reads before runner-3 joined
	SteadyTime  time.Duration

	Settle  time.Duration // runner-3's join until the 3 runners owned all shards
	Moved   []sharding.ShardID
	MovedTo map[string]int // moved partitions by new owner
	Window  time.Duration  // the move window: from the join to Settle + moveTail
	During  stats          // every read that began in the move window
	OnNew   stats          // of those, reads of moved partitions on their new owner
	Cold    int            // of those, reads that waited for ≥ ColdRecords records to be consumed
	After   stats          // reads that began after the move window
	// FirstOnNew is each moved partition's first read to reach its new
	// owner (the one that waited for the most records).
	FirstOnNew  []sample
	ColdRecords int64

	Phases   map[string]int // handoff events from the join to the end
	Warms    []warmCall     // WarmShard calls from the join to the end
	Releases int            // ReleaseShard calls from the join to the end

	Reads    reads
	Appended int64
	Keys     int
	Exact    int    // keys equal to the log's ground truth at the end
	Mismatch string // the first difference
	Stop     time.Duration
}

// summary is the outcome of a run.
type summary struct {
	Scenarios []*scenario
	Problems  []string // checks that failed
}

// run is the whole demo. It returns an error only when it could not run.
func run(ctx context.Context, o options) (_ *summary, err error) {
	say := demo.Say(o.out)
	e, err := demo.OpenEtcd(o.etcd, o.verbose, say, "partitions", "handoff", "plain")
	if err != nil {
		return nil, err
	}
	defer e.Close()
	say("log: %d partitions (one per shard) of %d records each, +%d records/s each under traffic; consuming a record costs %v,\n"+
		"         so a cold view of a partition takes about %v to build",
		numShards, o.history, o.rate, o.perRecord, round(time.Duration(o.history)*o.perRecord))

	s := &summary{}
	for i, handoff := range []bool{true, false} {
		sc, err := runScenario(ctx, o, []string{e.Endpoint}, e.Namespaces[i], handoff, say)
		if err != nil {
			return nil, err
		}
		s.Scenarios = append(s.Scenarios, sc)
	}
	s.Problems = problems(s)
	summarize(o.out, s)
	return s, nil
}

func runScenario(ctx context.Context, o options, endpoints []string, namespace string, handoff bool, say func(string, ...any)) (_ *scenario, err error) {
	sc := &scenario{Name: "handoff (default)", Handoff: true, ColdRecords: int64(o.history / 2), MovedTo: map[string]int{}}
	if !handoff {
		sc.Name, sc.Handoff = "DisableHandoff", false
	}
	fmt.Fprintf(o.out, "\n== scenario: scale-up 2 -> 3 runners, %s\n", sc.Name)

	l := newLogService(numShards, o.keysPerPart, o.history, o.perRecord)
	w := &world{log: l, hosts: map[string]*host{}}
	for _, id := range []string{"runner-1", "runner-2", "runner-3"} {
		w.hosts[id] = &host{id: id, log: l}
	}
	kind, get := newKeyKind(w)
	sc.Keys = len(l.keys)

	logger := demo.NewLogger(o.logs, o.verbose)
	var nodes []*demo.Node
	defer func() {
		if nodes != nil { // not stopped yet: an error cut the scenario short
			_, serr := demo.StopAll(nodes)
			err = errors.Join(err, serr)
		}
	}()
	start := func(id string, clientOnly bool) (*demo.Node, error) {
		cfg := runner.Config{ID: id, NumShards: numShards, LeaseTTL: leaseTTL, Logger: logger, DisableHandoff: !handoff, ClientOnly: clientOnly}
		if !clientOnly {
			cfg.ListenAddr = "127.0.0.1:0"
		}
		var onEvent func(runner.Event)
		var setup func(*runner.Runner) error
		if h := w.hosts[id]; h != nil { // not the gateway
			cfg.WarmShard, cfg.ReleaseShard, onEvent = h.warmShard, h.releaseShard, h.recordEvent
			setup = func(r *runner.Runner) error { return r.RunPerShard("consume", h.consumeShard) }
		}
		n, err := demo.StartNodeWith(endpoints, namespace, cfg, kind, onEvent, o.verbose, setup)
		if err == nil {
			nodes = append(nodes, n)
		}
		return n, err
	}
	gw, err := start("gateway", true)
	if err != nil {
		return nil, err
	}
	r1, err := start("runner-1", false)
	if err != nil {
		return nil, err
	}
	r2, err := start("runner-2", false)
	if err != nil {
		return nil, err
	}
	if sc.StartSettle, err = demo.WaitSettled(ctx, []*demo.Node{r1, r2}, gw, numShards, 30*time.Second); err != nil {
		return nil, err
	}
	say("runner-1 + runner-2 + gateway started; ownership settled in %v: %s", round(sc.StartSettle), demo.Ownership([]*demo.Node{r1, r2}))

	// First read of every partition: builds the views of the initial
	// owners (cold, unless a handoff at start-up warmed them already).
	if err := sc.firstReads(ctx, gw, get, l); err != nil {
		return nil, err
	}
	note := ""
	if sc.FirstCold < numShards {
		note = "; the others had been warmed by a handoff between the two runners at start-up"
	}
	say("first read of each partition: %d of %d waited for a replay of their whole log (slowest %v)%s", sc.FirstCold, numShards, round(sc.FirstMax), note)

	// Traffic, then the scale-up.
	say("traffic: %d readers ask get on %d keys through the gateway, a producer appends %d records/s; %v before runner-3 joins",
		o.readers, len(l.keys), o.rate*numShards, o.steady)
	trafficStart := time.Now()
	stopProducer := startProducer(l, o.rate)
	stopReaders := startReaders(ctx, gw.Runner(), get, l, o.readers)
	stopTraffic := func() {
		if stopReaders != nil {
			sc.Reads = stopReaders()
			sc.Appended = stopProducer()
			stopReaders = nil
		}
	}
	defer stopTraffic()
	if err := demo.Sleep(ctx, o.steady); err != nil {
		return nil, err
	}
	before := owners([]*demo.Node{r1, r2})
	join := time.Now()
	sc.SteadyTime = join.Sub(trafficStart)
	r3, err := start("runner-3", false)
	if err != nil {
		return nil, err
	}
	if sc.Settle, err = demo.WaitSettled(ctx, []*demo.Node{r1, r2, r3}, gw, numShards, 30*time.Second); err != nil {
		return nil, err
	}
	after := owners([]*demo.Node{r1, r2, r3})
	for id := range numShards {
		if before[id] != after[id] {
			sc.Moved = append(sc.Moved, sharding.ShardID(id))
			sc.MovedTo[after[id]]++
		}
	}
	say("runner-3 joined; %v later the 3 runners owned all shards: %s; %d partitions moved (%s)",
		round(sc.Settle), demo.Ownership([]*demo.Node{r1, r2, r3}), len(sc.Moved), byRunner(sc.MovedTo, "to"))
	if err := demo.Sleep(ctx, o.after); err != nil {
		return nil, err
	}
	stopTraffic()
	end := time.Now()

	// Analysis of the reads and hooks from the join on.
	sc.analyze(w, []*demo.Node{r1, r2, r3}, after, join, end)
	say("traffic stopped after %v: %d reads ok, %d failed, %d stale; %d records appended",
		round(end.Sub(trafficStart)), len(sc.Reads.Samples), sc.Reads.Failed, sc.Reads.Stale, sc.Appended)
	sc.Exact, sc.Mismatch = verify(ctx, gw.Runner(), get, l)
	say("check: %d/%d keys equal the sums of their partition's log", sc.Exact, sc.Keys)

	stopping := nodes
	nodes = nil
	if sc.Stop, err = demo.StopAll(stopping); err != nil {
		return nil, err
	}
	say("all runners shut down in %v", round(sc.Stop))
	return sc, nil
}

// firstReads reads every partition once through the gateway and counts
// the reads that replayed their whole log (cold) and the slowest.
func (sc *scenario) firstReads(ctx context.Context, gw *demo.Node, get *entity.MethodRef[Key, GetReq, GetResp], l *logService) error {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var firstErr error
	for p := range numShards {
		wg.Go(func() {
			actx, cancel := context.WithTimeout(ctx, askTimeout)
			defer cancel()
			t := time.Now()
			resp, err := get.Ask(actx, gw.Runner(), l.keys[l.byPart[p][0]], GetReq{})
			lat := time.Since(t)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstErr = errors.Join(firstErr, err)
				return
			}
			if resp.Replayed >= sc.ColdRecords {
				sc.FirstCold++
			}
			sc.FirstMax = max(sc.FirstMax, lat)
		})
	}
	wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("first reads: %w", firstErr)
	}
	return nil
}

// analyze sorts the reads into before the join, while shards moved (and
// those served by a moved shard's new owner), and after; and counts the
// handoff phases and hook calls between join and end.
func (sc *scenario) analyze(w *world, nodes []*demo.Node, after []string, join, end time.Time) {
	sc.Window = min(sc.Settle+moveTail, end.Sub(join))
	var steady, during, onNew, later []sample
	first := map[sharding.ShardID]int{} // index in sc.FirstOnNew
	for _, s := range sc.Reads.Samples {
		if s.At.Before(join) {
			steady = append(steady, s)
			continue
		}
		if s.At.Sub(join) >= sc.Window {
			later = append(later, s)
			continue
		}
		during = append(during, s)
		if slices.Contains(sc.Moved, s.Shard) && s.Runner == after[s.Shard] {
			onNew = append(onNew, s)
			if s.Replayed >= sc.ColdRecords {
				sc.Cold++
			}
			// The first read to reach the new owner found its view of the
			// partition emptiest: it waited for the most records. (By send
			// time a reader's first read may come second: a reader whose
			// route was the old owner's takes one more hop.)
			if i, ok := first[s.Shard]; !ok {
				first[s.Shard] = len(sc.FirstOnNew)
				sc.FirstOnNew = append(sc.FirstOnNew, s)
			} else if s.Replayed > sc.FirstOnNew[i].Replayed {
				sc.FirstOnNew[i] = s
			}
		}
	}
	sc.Steady, sc.During, sc.OnNew, sc.After = statsOf(steady), statsOf(during), statsOf(onNew), statsOf(later)
	sc.Phases = map[string]int{}
	for _, n := range nodes {
		h := w.hosts[n.Runner().ID()]
		for _, p := range h.handoffPhases() {
			if p.Time.Before(join) || p.Time.After(end) || (p.Phase == runner.PhaseCutover && p.Runner != p.To) {
				continue // cutover is reported by both sides: count the new owner's
			}
			sc.Phases[p.Phase]++
		}
		ws, rs := h.hookCalls(join, end)
		sc.Warms = append(sc.Warms, ws...)
		sc.Releases += rs
	}
}

// owners returns the owner of each shard among nodes ("" if none).
func owners(nodes []*demo.Node) []string {
	out := make([]string, numShards)
	for _, n := range nodes {
		for id := range n.Runner().Owned() {
			out[id] = n.Runner().ID()
		}
	}
	return out
}

// problems lists what contradicts the demo's guarantees: failed or stale
// reads, a view that differs from the log.
func problems(s *summary) []string {
	var out []string
	for _, sc := range s.Scenarios {
		if sc.Reads.Failed > 0 {
			out = append(out, fmt.Sprintf("%s: %d reads failed (e.g. %s)", sc.Name, sc.Reads.Failed, sc.Reads.FailSample))
		}
		if sc.Reads.Stale > 0 {
			out = append(out, fmt.Sprintf("%s: %d reads missed records appended before they began", sc.Name, sc.Reads.Stale))
		}
		if sc.Exact != sc.Keys {
			out = append(out, fmt.Sprintf("%s: %d/%d keys differ from the log (e.g. %s)", sc.Name, sc.Keys-sc.Exact, sc.Keys, sc.Mismatch))
		}
	}
	return out
}

// summarize prints the comparison and the conclusion.
func summarize(w io.Writer, s *summary) {
	if len(s.Scenarios) != 2 {
		return
	}
	h, p := s.Scenarios[0], s.Scenarios[1]
	const row = "%-46s %-26s %s\n"
	fmt.Fprintln(w)
	fmt.Fprintf(w, row, "scale-up 2 -> 3 runners", h.Name, p.Name)
	line := func(label string, f func(*scenario) string) { fmt.Fprintf(w, row, label, f(h), f(p)) }
	line("partitions moved", func(sc *scenario) string { return fmt.Sprintf("%d (%s)", len(sc.Moved), byRunner(sc.MovedTo, "")) })
	line("join -> all shards owned", func(sc *scenario) string { return round(sc.Settle).String() })
	line("WarmShard calls (avg records, avg time)", func(sc *scenario) string {
		if len(sc.Warms) == 0 {
			return "0"
		}
		var recs int64
		var took time.Duration
		for _, c := range sc.Warms {
			recs += c.Records
			took += c.Took
		}
		return fmt.Sprintf("%d (%d, %v)", len(sc.Warms), recs/int64(len(sc.Warms)), round(took/time.Duration(len(sc.Warms))))
	})
	line("ReleaseShard calls", func(sc *scenario) string { return fmt.Sprint(sc.Releases) })
	line("handoff events warming/ready/drained/cutover", func(sc *scenario) string {
		ph := sc.Phases
		out := fmt.Sprintf("%d/%d/%d/%d", ph[runner.PhaseWarming], ph[runner.PhaseReady], ph[runner.PhaseDrained], ph[runner.PhaseCutover])
		if ph[runner.PhaseAborted] > 0 {
			out += fmt.Sprintf(" (+%d aborted)", ph[runner.PhaseAborted])
		}
		return out
	})
	line(fmt.Sprintf("reads in the move window (join + settle + %v)", moveTail), func(sc *scenario) string {
		return fmt.Sprintf("%d in %v (%.1fk/s)", sc.During.N, round(sc.Window), float64(sc.During.N)/sc.Window.Seconds()/1000)
	})
	line("  latency p50 / p99 / max", func(sc *scenario) string { return latencies(sc.During) })
	line(fmt.Sprintf("  slow reads (> %v)", slowRead), func(sc *scenario) string { return fmt.Sprint(sc.During.Slow) })
	line("  of moved partitions on their new owner", func(sc *scenario) string { return fmt.Sprint(sc.OnNew.N) })
	line("    latency p50 / p99 / max", func(sc *scenario) string { return latencies(sc.OnNew) })
	line(fmt.Sprintf("    cold reads (waited for >= %d records)", h.ColdRecords), func(sc *scenario) string { return fmt.Sprint(sc.Cold) })
	line(fmt.Sprintf("    slow reads (> %v)", slowRead), func(sc *scenario) string { return fmt.Sprint(sc.OnNew.Slow) })
	line("    first read of each: max latency", func(sc *scenario) string { return round(firstMax(sc).Latency).String() })
	line("    first read of each: max records waited for", func(sc *scenario) string { return fmt.Sprint(maxReplayed(sc.FirstOnNew)) })
	line("reads before the join: reads/s", func(sc *scenario) string {
		return fmt.Sprintf("%.1fk/s", float64(sc.Steady.N)/sc.SteadyTime.Seconds()/1000)
	})
	line("  latency p50 / p99 / max", func(sc *scenario) string { return latencies(sc.Steady) })
	line("reads after the move window: p50 / p99 / max", func(sc *scenario) string { return latencies(sc.After) })
	line("failed / stale reads", func(sc *scenario) string { return fmt.Sprintf("%d / %d", sc.Reads.Failed, sc.Reads.Stale) })
	line("keys equal to the log at the end", func(sc *scenario) string { return fmt.Sprintf("%d/%d", sc.Exact, sc.Keys) })
	fmt.Fprintln(w, "(cold read: the new owner's view of the partition was empty and the read waited for its consumer to\n"+
		" build it from offset 0; slow reads include the reads waiting with it. The readers are closed-loop: a reader stuck behind a replay\n"+
		" sends nothing else meanwhile, so percentiles barely show a stall: see the slow reads, the max and the reads/s.)")
	fmt.Fprintln(w, conclusion(h, p))
	if len(s.Problems) == 0 {
		fmt.Fprintln(w, "OK: no failed or stale read, and every key equal to its partition's log, in both scenarios.")
	}
	for _, pr := range s.Problems {
		fmt.Fprintln(w, "PROBLEM:", pr)
	}
}

// conclusion compares the reads of the moved partitions on their new
// owner in the two scenarios.
func conclusion(h, p *scenario) string {
	nums := fmt.Sprintf("On the new owners, handoff vs DisableHandoff: cold reads %d vs %d, reads > %v %d vs %d,\n"+
		"            slowest read %v vs %v; reads/s of the whole cluster in the move window %.1fk vs %.1fk.",
		h.Cold, p.Cold, slowRead, h.OnNew.Slow, p.OnNew.Slow, round(h.OnNew.Max), round(p.OnNew.Max),
		float64(h.During.N)/h.Window.Seconds()/1000, float64(p.During.N)/p.Window.Seconds()/1000)
	cost := fmt.Sprintf("the move took %v instead of %v", round(h.Settle), round(p.Settle))
	switch {
	case len(h.Moved) == 0 || len(p.Moved) == 0:
		return "conclusion: nothing to compare: a scenario moved no partition."
	case h.Cold == 0 && p.Cold > 0 && h.OnNew.Max < p.OnNew.Max:
		return fmt.Sprintf("conclusion: with handoff the new owners replayed the %d moved partitions before taking them over\n"+
			"            (%s) and no read waited for a replay; without, their first reads replayed them.\n            %s", len(h.Moved), cost, nums)
	case h.Cold < p.Cold:
		return fmt.Sprintf("conclusion: warming avoided %d of %d cold reads (%s).\n            %s", p.Cold-h.Cold, p.Cold, cost, nums)
	default:
		return fmt.Sprintf("conclusion: no advantage of handoff measured in this run.\n            %s", nums)
	}
}

func firstMax(sc *scenario) sample {
	var m sample
	for _, s := range sc.FirstOnNew {
		if s.Latency > m.Latency {
			m = s
		}
	}
	return m
}

func maxReplayed(ss []sample) int64 {
	var m int64
	for _, s := range ss {
		m = max(m, s.Replayed)
	}
	return m
}

func latencies(st stats) string {
	if st.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%v / %v / %v", round(st.P50), round(st.P99), round(st.Max))
}

// byRunner reads "to runner-3 5, to runner-1 1" (prep "to"), sorted by ID.
func byRunner(m map[string]int, prep string) string {
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, strings.TrimSpace(fmt.Sprintf("%s %s %d", prep, id, m[id])))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// round is demo.Round, finer below 100µs: the latencies of reads
// answered from a warm view.
func round(d time.Duration) time.Duration {
	if d < 100*time.Microsecond {
		return d.Round(time.Microsecond)
	}
	return demo.Round(d)
}
