// Command peers measures shardhost side by side with other Go actor
// systems (protoactor-go, hollywood, goakt, ergo) and the raw loopback TCP
// floor, in one process on the same machine, interleaved: every round
// runs every scenario on every system (in a rotating order) before the
// next round starts, and the table gives each figure's median over the
// rounds with its ratio to shardhost's.
//
// Scenarios: tell (one actor, msgs/s), ask with 1 and 64 callers (each
// caller its own actor, asks/s), activation (new actors each processing
// one message, actors/s) and the heap each idle actor keeps, remote ask
// with 1 caller (p50/p99 latency) and 64 callers (asks/s) between two
// nodes on loopback TCP, in each peer's cluster or remote mode. The floor
// echoes a 64-byte frame, one write and one read per message, one
// connection per caller.
//
// Usage (from bench/peers):
//
//	go run . [-rounds 5] [-d 1s] [-entities 20000] [-systems shardhost,hollywood] [-scenarios tell,ask64] [-json]
package main

import (
	_ "a.peers.local/protoconflict" // before the actor systems: see its doc
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

func allSystems() []system {
	return []system{
		{name: "shardhost", newLocal: newShardhostLocal, newRemote: newShardhostRemote,
			remoteLabel: "owner + client-only runner, gRPC streams"},
		{name: "shardhost-ref", newLocal: newShardhostRefLocal,
			remoteSkip: "a handle's remote calls go by ID: the shardhost column"},
		{name: "shardhost-proto", newRemote: newShardhostProtoRemote,
			localSkip:   "local calls never encode: the shardhost column",
			remoteLabel: "as shardhost, with the protocol buffer codec (entity/protocodec)"},
		{name: "protoactor", newLocal: newProtoactorLocal, newRemote: newProtoactorCluster,
			remoteLabel: "cluster: a hosting member + a member without kinds asking, gRPC remote, disthash lookup, in-memory membership"},
		{name: "hollywood", newLocal: newHollywoodLocal, newRemote: newHollywoodRemote,
			remoteLabel: "remote: two engines, DRPC streams"},
		{name: "goakt", newLocal: newGoaktLocal, newRemote: newGoaktRemote, maxEntities: 2000,
			entitiesWhy: "its system's Stop takes time quadratic in its actors here (5 000: 30 s, 10 000: 90 s)",
			remoteLabel: "remoting: a served system + Remoting client, connect over HTTP/2"},
		{name: "ergo", newLocal: newErgoLocal, newRemote: newErgoRemote,
			remoteLabel: "network: two nodes, ergo's protocol, built-in registrar"},
		{name: "tcp", newRemote: newTCPFloor,
			localSkip:   "a network floor only",
			remoteLabel: "raw echo of a 64-byte frame, one write + one read per message, a connection per caller"},
	}
}

func main() {
	slog.SetDefault(quietLog) // hollywood logs through the default logger
	// Ergo nodes catch SIGINT and SIGTERM to stop themselves gracefully;
	// the command still ends on them.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		fmt.Fprintln(os.Stderr, "peers: stopped by", s)
		os.Exit(1)
	}()
	var (
		rounds    = flag.Int("rounds", 5, "interleaved rounds (each figure is the median over them)")
		d         = flag.Duration("d", time.Second, "duration of each throughput or latency measurement")
		entities  = flag.Int("entities", 20_000, "actors created by each activation measurement (goakt did not create 100 000 within 3 minutes here)")
		only      = flag.String("systems", "", "comma-separated systems to run (default all)")
		scens     = flag.String("scenarios", "", "comma-separated scenarios: tell,ask1,ask64,activate,remote1,remote64 (default all)")
		asJSON    = flag.Bool("json", false, "print the results as JSON instead of a table")
		load      = flag.String("load", "", "print the table of a run saved with -json in this file, and measure nothing")
		perRunMax = flag.Duration("timeout", 3*time.Minute, "bound of one measurement, start and stop included")
	)
	flag.Parse()
	if *rounds < 1 || *d <= 0 || *entities < 1 {
		fmt.Fprintln(os.Stderr, "peers: -rounds, -d and -entities must be positive")
		os.Exit(2)
	}
	if *load != "" {
		if err := printSaved(os.Stdout, *load); err != nil {
			fmt.Fprintln(os.Stderr, "peers:", err)
			os.Exit(2)
		}
		return
	}
	systems, err := pick(allSystems(), *only, func(s system) string { return s.name })
	if err == nil {
		var sc []scenario
		sc, err = pick(scenarios(), *scens, func(s scenario) string { return s.name })
		if err == nil {
			cfg := config{duration: *d, entities: *entities}
			res := run(systems, sc, cfg, *rounds, *perRunMax, os.Stderr)
			if *asJSON {
				err = writeJSON(os.Stdout, res)
			} else {
				writeTable(os.Stdout, res)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(2)
	}
}

// pick keeps the items named in list (all when list is empty), in their
// order; an unknown name is an error.
func pick[T any](all []T, list string, name func(T) string) ([]T, error) {
	if list == "" {
		return all, nil
	}
	var out []T
	for _, want := range strings.Split(list, ",") {
		i := slices.IndexFunc(all, func(t T) bool { return name(t) == want })
		if i < 0 {
			var names []string
			for _, t := range all {
				names = append(names, name(t))
			}
			return nil, fmt.Errorf("unknown name %q (have %s)", want, strings.Join(names, ", "))
		}
		out = append(out, all[i])
	}
	return out, nil
}

// results holds every sample of a run of the command.
type results struct {
	Systems []string            `json:"systems"`
	Rows    []row               `json:"rows"`
	Modes   map[string]string   `json:"remote_modes"`
	Skips   map[string][]string `json:"skips,omitempty"`  // system -> reasons
	Errors  map[string][]string `json:"errors,omitempty"` // system -> errors
	Notes   map[string][]string `json:"notes,omitempty"`  // system -> how it was measured differently
	Rounds  int                 `json:"rounds"`
	Env     string              `json:"env"`
}

type row struct {
	Metric string           `json:"metric"`
	Unit   string           `json:"unit"`
	Higher bool             `json:"higher_is_better"`
	Cells  map[string]*cell `json:"cells"` // by system
}

type cell struct {
	Samples []float64 `json:"samples"`
	Median  float64   `json:"median"`
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
	Ratio   float64   `json:"ratio_to_shardhost,omitempty"` // median / shardhost's median
	Skip    string    `json:"skip,omitempty"`
}

func run(systems []system, sc []scenario, cfg config, rounds int, perRunMax time.Duration, progress io.Writer) *results {
	res := &results{Modes: map[string]string{}, Skips: map[string][]string{}, Errors: map[string][]string{}, Notes: map[string][]string{}, Rounds: rounds,
		Env: fmt.Sprintf("%s %s/%s GOMAXPROCS=%d", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0))}
	rowOf := map[string]*row{}
	for _, s := range sc {
		for _, m := range s.metrics {
			r := &row{Metric: m.name, Unit: m.unit, Higher: m.higher, Cells: map[string]*cell{}}
			res.Rows = append(res.Rows, *r)
			rowOf[m.name] = &res.Rows[len(res.Rows)-1]
		}
	}
	for _, sys := range systems {
		res.Systems = append(res.Systems, sys.name)
		if sys.newRemote != nil {
			res.Modes[sys.name] = sys.remoteLabel
		}
		if sys.maxEntities > 0 && sys.maxEntities < cfg.entities && slices.ContainsFunc(sc, func(s scenario) bool { return s.name == "activate" }) {
			res.Notes[sys.name] = append(res.Notes[sys.name], fmt.Sprintf("activation with %d actors, not %d: %s", sys.maxEntities, cfg.entities, sys.entitiesWhy))
		}
	}
	for round := range rounds {
		for _, s := range sc {
			for k := range systems { // rotate the order each round
				sys := systems[(k+round)%len(systems)]
				vals, err := runOnce(sys, s, cfg, perRunMax)
				var sk *skipError
				switch {
				case errors.As(err, &sk):
					for _, m := range s.metrics {
						rowOf[m.name].cell(sys.name).Skip = sk.reason
					}
					if round == 0 {
						res.Skips[sys.name] = append(res.Skips[sys.name], s.name+": "+sk.reason)
					}
				case err != nil:
					res.Errors[sys.name] = append(res.Errors[sys.name], fmt.Sprintf("round %d %s: %v", round+1, s.name, err))
					fmt.Fprintf(progress, "round %d %-9s %-10s error: %v\n", round+1, s.name, sys.name, err)
				default:
					var parts []string
					for _, m := range s.metrics {
						c := rowOf[m.name].cell(sys.name)
						c.Samples = append(c.Samples, vals[m.name])
						parts = append(parts, m.name+" "+format(vals[m.name], m.unit))
					}
					fmt.Fprintf(progress, "round %d %-9s %-10s %s\n", round+1, s.name, sys.name, strings.Join(parts, ", "))
				}
			}
		}
	}
	for i := range res.Rows {
		res.Rows[i].summarize()
	}
	return res
}

func (r *row) cell(sys string) *cell {
	c := r.Cells[sys]
	if c == nil {
		c = &cell{}
		r.Cells[sys] = c
	}
	return c
}

// summarize sets each cell's median, spread and ratio to shardhost.
func (r *row) summarize() {
	for _, c := range r.Cells {
		if len(c.Samples) == 0 {
			continue
		}
		c.Median = median(c.Samples)
		c.Min, c.Max = slices.Min(c.Samples), slices.Max(c.Samples)
	}
	base := r.Cells["shardhost"]
	if base == nil || len(base.Samples) == 0 || base.Median == 0 {
		return
	}
	for _, c := range r.Cells {
		if len(c.Samples) > 0 {
			c.Ratio = c.Median / base.Median
		}
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// runOnce starts a fresh system of the scenario's mode, measures and
// closes it, bounded by max (a system that hangs is reported, and left).
func runOnce(sys system, s scenario, cfg config, max time.Duration) (map[string]float64, error) {
	if s.remote && sys.newRemote == nil {
		return nil, skip("%s", cmpOr(sys.remoteSkip, "no remote mode"))
	}
	if !s.remote && sys.newLocal == nil {
		return nil, skip("%s", cmpOr(sys.localSkip, "no local mode"))
	}
	if sys.maxEntities > 0 {
		cfg.entities = min(cfg.entities, sys.maxEntities)
	}
	type outcome struct {
		vals map[string]float64
		err  error
	}
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		if s.remote {
			r, err := sys.newRemote()
			if err != nil {
				done <- outcome{err: fmt.Errorf("start: %w", err)}
				return
			}
			o.vals, o.err = s.run(cfg, nil, r)
			r.Close()
		} else {
			l, err := sys.newLocal()
			if err != nil {
				done <- outcome{err: fmt.Errorf("start: %w", err)}
				return
			}
			o.vals, o.err = s.run(cfg, l, nil)
			l.Close()
		}
		done <- o
	}()
	ctx, cancel := context.WithTimeout(context.Background(), max)
	defer cancel()
	select {
	case o := <-done:
		runtime.GC() // the next measurement starts without this one's garbage
		return o.vals, o.err
	case <-ctx.Done():
		return nil, fmt.Errorf("no result within %v (the system is left running: later figures of this run may be disturbed)", max)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// format prints v in unit compactly: rates with k/M, others as numbers.
func format(v float64, unit string) string {
	switch {
	case strings.HasSuffix(unit, "/s") && v >= 1e6:
		return fmt.Sprintf("%.2f M", v/1e6)
	case strings.HasSuffix(unit, "/s") && v >= 1e3:
		return fmt.Sprintf("%.0f k", v/1e3)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.1f", v)
	}
}

func writeTable(w io.Writer, res *results) {
	fmt.Fprintf(w, "medians of %d interleaved rounds (%s); (x) = median / shardhost's median\n\n", res.Rounds, res.Env)
	header := append([]string{"metric", "unit"}, res.Systems...)
	lines := [][]string{header}
	for _, r := range res.Rows {
		line := []string{r.Metric, r.Unit}
		for _, sys := range res.Systems {
			c := r.Cells[sys]
			switch {
			case c == nil:
				line = append(line, "error")
			case c.Skip != "":
				line = append(line, "-")
			case len(c.Samples) == 0:
				line = append(line, "error")
			case sys == "shardhost":
				line = append(line, format(c.Median, r.Unit))
			default:
				line = append(line, fmt.Sprintf("%s (%.2fx)", format(c.Median, r.Unit), c.Ratio))
			}
		}
		lines = append(lines, line)
	}
	widths := make([]int, len(header))
	for _, l := range lines {
		for i, s := range l {
			widths[i] = max(widths[i], len([]rune(s)))
		}
	}
	for k, l := range lines {
		fmt.Fprint(w, "|")
		for i, s := range l {
			fmt.Fprintf(w, " %s%s |", s, strings.Repeat(" ", widths[i]-len([]rune(s))))
		}
		fmt.Fprintln(w)
		if k == 0 {
			fmt.Fprint(w, "|")
			for i := range l {
				fmt.Fprintf(w, "%s|", strings.Repeat("-", widths[i]+2))
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintln(w, "\nremote modes:")
	for _, sys := range res.Systems {
		if m, ok := res.Modes[sys]; ok {
			fmt.Fprintf(w, "  %-10s %s\n", sys, m)
		}
	}
	printMap(w, "skipped (-):", res.Systems, res.Skips)
	printMap(w, "notes:", res.Systems, res.Notes)
	printMap(w, "errors:", res.Systems, res.Errors)
}

func printMap(w io.Writer, title string, order []string, m map[string][]string) {
	if len(m) == 0 {
		return
	}
	fmt.Fprintln(w, title)
	for _, sys := range order {
		for _, s := range m[sys] {
			fmt.Fprintf(w, "  %-10s %s\n", sys, s)
		}
	}
}

func writeJSON(w io.Writer, res *results) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// printSaved prints the table of a run saved with -json.
func printSaved(w io.Writer, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var res results
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	writeTable(w, &res)
	return nil
}
