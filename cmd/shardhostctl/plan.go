package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// plan: a dry run of the assignment after a membership change, computed
// as every runner computes it (package runner's assignInputLocked): the
// registered runners with their weights, a runner whose record says
// draining counting as weight 0, the cluster's strategy, and — for a
// strategy that reads it (sticky-balanced) — the current owner of each
// shard from its lock. Nothing is written.

type planOpts struct {
	weight   int
	strategy string
	all      bool
}

func planFlags(fs *flag.FlagSet) any {
	f := &planOpts{}
	fs.IntVar(&f.weight, "weight", 1, "join: the `weight` of the joining runner")
	fs.StringVar(&f.strategy, "strategy", "", "the assignment `strategy` (default: the cluster record's)")
	fs.BoolVar(&f.all, "moves", false, "text: list every moving shard (JSON always does)")
	return f
}

// PlanChange is the change a plan is for.
type PlanChange struct {
	Action string `json:"action"` // join, leave, drain or weight
	Runner string `json:"runner"`
	Weight int    `json:"weight,omitempty"` // join, weight: the runner's weight after
}

// PlanRunner is one runner in a plan: its weight and shard count now and
// after the change.
type PlanRunner struct {
	ID          string `json:"id"`
	WeightNow   int    `json:"weight_now"`   // effective: 0 while draining; -1 not registered
	WeightAfter int    `json:"weight_after"` // -1 gone
	Owned       int    `json:"owned"`        // shards whose lock is under its lease now
	AssignedNow int    `json:"assigned_now"` // the assignment the runners compute now
	After       int    `json:"after"`        // the assignment after the change
	In          int    `json:"in"`           // shards that move to it
	Out         int    `json:"out"`          // shards that move away from it
}

// PlanMove is one shard whose owner changes.
type PlanMove struct {
	Shard sharding.ShardID `json:"shard"`
	From  string           `json:"from,omitempty"` // its owner now ("" when unowned)
	To    string           `json:"to"`             // its assignee after ("" when no runner can take it)
}

// Plan is `plan -json`.
type Plan struct {
	Endpoints string       `json:"endpoints"`
	Namespace string       `json:"namespace"`
	Revision  int64        `json:"revision"`
	NumShards int          `json:"num_shards"`
	Strategy  string       `json:"strategy"`
	Change    PlanChange   `json:"change"`
	Runners   []PlanRunner `json:"runners"`
	Moves     []PlanMove   `json:"moves"` // by shard
	// Assignment is the runner of each shard after the change.
	Assignment sharding.Assignment `json:"assignment"`
}

func cmdPlan(ctx context.Context, c *cluster, flags any, args []string, stdout, stderr io.Writer) error {
	f := flags.(*planOpts)
	change, err := parsePlanChange(args, f)
	if err != nil {
		return err
	}
	name := cmp.Or(f.strategy, c.o.strategy)
	if name == "" {
		return fmt.Errorf("%w: the cluster record names no strategy (no hosting runner has published one): pass -strategy", errUsage)
	}
	strategy, err := sharding.StrategyByName(name)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if f.strategy != "" && c.o.strategy != "" && f.strategy != c.o.strategy {
		fmt.Fprintf(stderr, "shardhostctl: warning: -strategy %s differs from the cluster's %s: this is not what the cluster would do\n", f.strategy, c.o.strategy)
	}
	st, err := c.read(ctx)
	if err != nil {
		return err
	}
	p, err := plan(st, c.o.shards, strategy, change)
	if err != nil {
		return err
	}
	p.Endpoints, p.Namespace, p.Revision = c.o.endpoints, c.ns, int64(st.rev)
	if c.o.json {
		return printJSON(stdout, p)
	}
	printPlan(stdout, p, f.all)
	return nil
}

// parsePlanChange reads `join R`, `leave R`, `drain R` and `weight R W`.
func parsePlanChange(args []string, f *planOpts) (PlanChange, error) {
	usage := fmt.Errorf("%w: want plan join RUNNER [-weight W] | leave RUNNER | drain RUNNER | weight RUNNER W", errUsage)
	if len(args) < 2 {
		return PlanChange{}, usage
	}
	ch := PlanChange{Action: args[0], Runner: args[1]}
	if err := storage.ValidateRunnerID(ch.Runner); err != nil {
		return ch, fmt.Errorf("%w: %w", errUsage, err)
	}
	want := 2
	switch ch.Action {
	case "join":
		ch.Weight = f.weight
	case "leave", "drain":
	case "weight":
		want = 3
		if len(args) == 3 {
			w, err := strconv.Atoi(args[2])
			if err != nil {
				return ch, fmt.Errorf("%w: weight %q: not a number", errUsage, args[2])
			}
			ch.Weight = w
		}
	default:
		return ch, usage
	}
	if len(args) != want {
		return ch, usage
	}
	if ch.Weight < 0 || ch.Weight > sharding.MaxWeight || (ch.Action == "join" && ch.Weight == 0) {
		return ch, fmt.Errorf("%w: weight %d: want 1..%d (to plan weight 0, plan a drain)", errUsage, ch.Weight, sharding.MaxWeight)
	}
	return ch, nil
}

// plan computes the assignment now and after change, as the runners do.
func plan(st *state, n int, strategy sharding.Strategy, change PlanChange) (*Plan, error) {
	p := &Plan{NumShards: n, Strategy: strategy.Name(), Change: change, Moves: []PlanMove{}}
	rows := map[string]*PlanRunner{}
	now := members(st)
	for _, r := range now {
		rows[r.ID] = &PlanRunner{ID: r.ID, WeightNow: r.Weight, WeightAfter: r.Weight}
	}
	after := slices.Clone(now)
	i := slices.IndexFunc(after, func(r sharding.Runner) bool { return r.ID == change.Runner })
	switch {
	case change.Action == "join" && i >= 0:
		return nil, fmt.Errorf("runner %q is registered already (runners: %s); plan a weight change instead", change.Runner, st.runnerIDs())
	case change.Action == "join":
		after = append(after, sharding.Runner{ID: change.Runner, Weight: change.Weight})
		rows[change.Runner] = &PlanRunner{ID: change.Runner, WeightNow: -1, WeightAfter: change.Weight}
	case i < 0:
		return nil, fmt.Errorf("no runner %q is registered (runners: %s)", change.Runner, st.runnerIDs())
	case change.Action == "leave":
		after = slices.Delete(after, i, i+1)
		rows[change.Runner].WeightAfter = -1
	case change.Action == "drain":
		after[i].Weight = 0
		rows[change.Runner].WeightAfter = 0
	case change.Action == "weight" && draining(st, change.Runner):
		return nil, fmt.Errorf("runner %q is draining: it takes no shard whatever its weight until it is undrained", change.Runner)
	case change.Action == "weight":
		after[i].Weight = change.Weight
		rows[change.Runner].WeightAfter = change.Weight
	}
	owner := lockOwners(st, n)
	for _, id := range owner {
		if id != "" {
			rows[id].Owned++
		}
	}
	assign := func(rs []sharding.Runner) (sharding.Assignment, error) { return assignOf(strategy, n, rs, owner) }
	cur, err := assign(now)
	if err != nil {
		return nil, fmt.Errorf("the assignment now: %w", err)
	}
	next, err := assign(after)
	if err != nil {
		return nil, fmt.Errorf("the assignment after the change: %w", err)
	}
	p.Assignment = next
	for s := range n {
		if r := rows[cur[s]]; cur[s] != "" {
			r.AssignedNow++
		}
		if r := rows[next[s]]; next[s] != "" {
			r.After++
		}
		if next[s] == owner[s] {
			continue
		}
		p.Moves = append(p.Moves, PlanMove{Shard: sharding.ShardID(s), From: owner[s], To: next[s]})
		if r := rows[owner[s]]; owner[s] != "" {
			r.Out++
		}
		if r := rows[next[s]]; next[s] != "" {
			r.In++
		}
	}
	for _, id := range slices.Sorted(maps.Keys(rows)) {
		p.Runners = append(p.Runners, *rows[id])
	}
	return p, nil
}

// lockOwners returns the owner of each shard now: the registered runner whose
// lease holds its lock (what sticky-balanced keeps, and where moves
// start); "" when unowned or held by no registered runner.
func lockOwners(st *state, n int) sharding.Assignment {
	owner := make(sharding.Assignment, n)
	for id, l := range st.locks {
		if int(id) < n && l.Epoch != 0 {
			if r, ok := st.byLease[l.Lease]; ok {
				owner[id] = r.ID
			}
		}
	}
	return owner
}

// members returns the runners as the assignment weighs them: a draining
// one at weight 0.
func members(st *state) []sharding.Runner {
	var out []sharding.Runner
	for _, r := range st.runners {
		w := r.Weight
		if r.Draining {
			w = 0
		}
		out = append(out, sharding.Runner{ID: r.ID, Weight: w})
	}
	return out
}

// assignOf computes the assignment of n shards to rs as the runners do,
// from the owners now for a strategy that keeps shards where they are.
func assignOf(strategy sharding.Strategy, n int, rs []sharding.Runner, owner sharding.Assignment) (sharding.Assignment, error) {
	in := sharding.Input{NumShards: n, Runners: rs}
	if !sharding.IgnoresCurrent(strategy) {
		in.Current = owner
	}
	return strategy.Assign(in)
}

// draining reports whether runner id's record says draining.
func draining(st *state, id string) bool {
	r, ok := st.runner(id)
	return ok && r.Draining
}

func printPlan(w io.Writer, p *Plan, all bool) {
	what := map[string]string{
		"join":   fmt.Sprintf("runner %s joins with weight %d", p.Change.Runner, p.Change.Weight),
		"leave":  fmt.Sprintf("runner %s leaves", p.Change.Runner),
		"drain":  fmt.Sprintf("runner %s is drained", p.Change.Runner),
		"weight": fmt.Sprintf("runner %s changes weight to %d", p.Change.Runner, p.Change.Weight),
	}[p.Change.Action]
	fmt.Fprintf(w, "plan: %s (etcd %s, namespace %q, revision %d, %d shards, strategy %s); nothing is written\n\n",
		what, p.Endpoints, p.Namespace, p.Revision, p.NumShards, p.Strategy)
	tw := table(w)
	fmt.Fprintln(tw, "RUNNER\tWEIGHT\tOWNED NOW\tAFTER\tIN\tOUT")
	weight := func(v int) string {
		if v < 0 {
			return "-"
		}
		return strconv.Itoa(v)
	}
	for _, r := range p.Runners {
		after := strconv.Itoa(r.After)
		if r.WeightAfter < 0 {
			after = "gone"
		}
		wt := weight(r.WeightNow)
		if r.WeightAfter != r.WeightNow {
			wt += " -> " + weight(r.WeightAfter)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\n", r.ID, wt, r.Owned, after, r.In, r.Out)
	}
	tw.Flush()
	unassigned := 0
	for _, id := range p.Assignment {
		if id == "" {
			unassigned++
		}
	}
	if p.Change.Action == "weight" && p.Strategy == sharding.StickyBalanced().Name() {
		fmt.Fprintf(w, "\nnote: a runner's weight changes when it restarts with the new weight; with %s a graceful restart\n"+
			"first hands its shards to the others, so the cluster goes through `plan leave` then `plan join -weight`, and\n"+
			"may end elsewhere than this plan (which keeps every shard where it is unless the weights move it)\n", p.Strategy)
	}
	fmt.Fprintf(w, "\n%d shards move", len(p.Moves))
	if unassigned > 0 {
		fmt.Fprintf(w, "; %d would have no runner (no runner with weight > 0 is left)", unassigned)
	}
	fmt.Fprintln(w)
	byPair := map[string][]sharding.ShardID{}
	for _, m := range p.Moves {
		k := cmp.Or(m.From, "(unowned)") + " -> " + cmp.Or(m.To, "(none)")
		byPair[k] = append(byPair[k], m.Shard)
	}
	for _, k := range slices.Sorted(maps.Keys(byPair)) {
		shards := byPair[k]
		fmt.Fprintf(w, "  %s: %d (%s)\n", k, len(shards), shardList(shards, all))
	}
}

// shardList formats shards as ranges ("3, 7-9"), the first few unless all.
func shardList(shards []sharding.ShardID, all bool) string {
	var parts []string
	for i := 0; i < len(shards); {
		j := i
		for j+1 < len(shards) && shards[j+1] == shards[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", shards[i], shards[j]))
		} else {
			parts = append(parts, shards[i].String())
		}
		i = j + 1
	}
	const few = 12
	if !all && len(parts) > few {
		return strings.Join(parts[:few], ", ") + fmt.Sprintf(", … %d more; -moves lists all", len(parts)-few)
	}
	return strings.Join(parts, ", ")
}
