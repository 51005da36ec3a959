package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// status and shards: what the cluster looks like.

// StatusRunner is one runner in `status -json`.
type StatusRunner struct {
	ID          string    `json:"id"`
	State       string    `json:"state"` // active, draining, drain requested, shutting down, stopped, weight 0
	Weight      int       `json:"weight"`
	Draining    bool      `json:"draining"`        // its record says so
	DrainReq    bool      `json:"drain_requested"` // drains/{ID} exists
	Shards      int       `json:"shards"`          // locks under its lease
	Address     string    `json:"address,omitempty"`
	Lease       string    `json:"lease"`
	LeaseTTL    float64   `json:"lease_ttl_s"` // left on the server; -1 if expired
	Incarnation string    `json:"incarnation"`
	Started     time.Time `json:"started"`
}

// Status is `status -json`.
type Status struct {
	Endpoints  string         `json:"endpoints"`
	Namespace  string         `json:"namespace"`
	Revision   int64          `json:"revision"`
	NumShards  int            `json:"num_shards"`
	Strategy   string         `json:"strategy,omitempty"` // the cluster record's ("" when none is published)
	Runners    []StatusRunner `json:"runners"`
	Corrupt    []string       `json:"corrupt_runner_records,omitempty"`
	Owned      int            `json:"owned"`
	Unowned    int            `json:"unowned"`
	Unknown    int            `json:"unknown_owner"` // locks under a lease of no registered runner
	Handoffs   int            `json:"handoffs"`
	Drains     []string       `json:"drain_requests"`   // runners with a drain request, registered or not
	HandoffsBy map[string]int `json:"handoffs_by_pair"` // "from -> to"
}

type statusOpts struct {
	wait        string
	waitTimeout time.Duration
}

func statusFlags(fs *flag.FlagSet) any {
	f := &statusOpts{}
	fs.StringVar(&f.wait, "wait", "", "wait until the cluster is `balanced` (every shard owned by its assignee) or `owned` (every shard owned), then print the status")
	fs.DurationVar(&f.waitTimeout, "wait-timeout", 2*time.Minute, "bound on -wait")
	return f
}

func cmdStatus(ctx context.Context, c *cluster, flags any, _ []string, stdout, stderr io.Writer) error {
	f := flags.(*statusOpts)
	var (
		st  *state
		err error
	)
	if f.wait != "" {
		st, err = waitStatus(ctx, c, f.wait, f.waitTimeout, stderr)
	} else {
		st, err = c.read(ctx)
	}
	if err != nil {
		return err
	}
	out := Status{Endpoints: c.o.endpoints, Namespace: c.ns, Revision: int64(st.rev), NumShards: c.o.shards,
		Strategy: c.o.strategy, Runners: []StatusRunner{}, Corrupt: st.corrupt, HandoffsBy: map[string]int{}}
	perLease := map[storage.LeaseID]int{}
	for _, l := range st.locks {
		if _, ok := st.owner(l); ok {
			out.Owned++
			perLease[l.Lease]++
		} else {
			out.Unknown++
		}
	}
	out.Unowned = c.o.shards - len(st.locks)
	for _, r := range st.runners {
		_, req := st.drains[r.ID]
		sr := StatusRunner{ID: r.ID, State: runnerState(r, req), Weight: r.Weight, Draining: r.Draining, DrainReq: req, Shards: perLease[r.Lease],
			Address: r.Address, Lease: fmt.Sprintf("%x", r.Lease), Incarnation: r.Incarnation, Started: r.Started, LeaseTTL: -1}
		cctx, cancel := c.ctx(ctx)
		if ttl, err := c.store.LeaseTimeToLive(cctx, r.Lease); err == nil {
			sr.LeaseTTL = ttl.Seconds()
		}
		cancel()
		out.Runners = append(out.Runners, sr)
	}
	out.Drains = slices.Sorted(maps.Keys(st.drains))
	for _, h := range st.handoffs {
		out.Handoffs++
		out.HandoffsBy[h.From+" -> "+h.To]++
	}
	if c.o.json {
		return printJSON(stdout, out)
	}
	fmt.Fprintf(stdout, "etcd %s, namespace %q, revision %d, %d shards", out.Endpoints, out.Namespace, out.Revision, out.NumShards)
	if out.Strategy != "" {
		fmt.Fprintf(stdout, ", strategy %s", out.Strategy)
	}
	fmt.Fprint(stdout, "\n\n")
	tw := table(stdout)
	fmt.Fprintln(tw, "RUNNER\tSTATE\tWEIGHT\tSHARDS\tADDRESS\tLEASE\tTTL\tUP\tINCARNATION")
	now := time.Now()
	for _, r := range out.Runners {
		ttl := "expired"
		if r.LeaseTTL >= 0 {
			ttl = fmt.Sprintf("%gs", r.LeaseTTL)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.State, r.Weight, r.Shards, r.Address, r.Lease, ttl,
			now.Sub(r.Started).Round(time.Second), r.Incarnation)
	}
	if len(out.Runners) == 0 {
		fmt.Fprintln(tw, "(no runner registered)")
	}
	tw.Flush()
	for _, k := range out.Corrupt {
		fmt.Fprintf(stdout, "corrupt runner record: %s\n", k)
	}
	for _, id := range out.Drains {
		if _, ok := st.runner(id); !ok {
			req := st.drains[id]
			fmt.Fprintf(stdout, "drain requested for %s (not registered; it will start drained), by %s at %s\n",
				id, orDash(req.By), req.Requested.Format(time.RFC3339))
		}
	}
	fmt.Fprintf(stdout, "\nshards: %d of %d owned, %d unowned", out.Owned, out.NumShards, out.Unowned)
	if out.Unknown > 0 {
		fmt.Fprintf(stdout, ", %d under a lease of no registered runner (a crashed incarnation's, until it expires)", out.Unknown)
	}
	fmt.Fprintln(stdout)
	fmt.Fprintf(stdout, "handoffs in flight: %d", out.Handoffs)
	pairs := slices.Sorted(maps.Keys(out.HandoffsBy))
	for i, p := range pairs {
		sep := ", "
		if i == 0 {
			sep = " ("
		}
		fmt.Fprintf(stdout, "%s%s: %d", sep, p, out.HandoffsBy[p])
	}
	if len(pairs) > 0 {
		fmt.Fprint(stdout, ")")
	}
	fmt.Fprintln(stdout)
	return nil
}

// waitStatus polls the namespace until the cluster is balanced or owned
// (cond), at most limit, and returns the state that met it. Progress goes
// to progress when what is missing changes.
func waitStatus(ctx context.Context, c *cluster, cond string, limit time.Duration, progress io.Writer) (*state, error) {
	if cond != "balanced" && cond != "owned" {
		return nil, fmt.Errorf("%w: -wait %q: want balanced or owned", errUsage, cond)
	}
	deadline := time.Now().Add(limit)
	last := ""
	for {
		missing := "no cluster record (no runner has started)"
		st, err := c.readStored(ctx)
		if err != nil {
			return nil, err
		}
		if c.o.strategy == "" && !c.o.shardsSet {
			// Started before the first runner: its record settles the
			// shard count and the strategy.
			cctx, cancel := c.ctx(ctx)
			info, ok, err := c.store.ReadCluster(cctx)
			cancel()
			if err == nil && ok {
				c.o.strategy, c.o.shards = info.Strategy, info.NumShards
			}
		}
		if c.o.strategy != "" || cond == "owned" {
			var strategy sharding.Strategy
			if cond == "balanced" {
				if strategy, err = sharding.StrategyByName(c.o.strategy); err != nil {
					return nil, err
				}
			}
			if missing, err = notYet(st, c.o.shards, strategy); err != nil {
				return nil, err
			}
		}
		if missing == "" {
			return st, nil
		}
		if missing != last {
			fmt.Fprintf(progress, "shardhostctl: not %s yet: %s\n", cond, missing)
			last = missing
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("not %s after %v: %s", cond, limit, missing)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// notYet says what keeps the cluster from being owned (strategy nil:
// every shard owned by a registered runner) or balanced (as well, every
// shard owned by the runner the strategy assigns it to, with no handoff in
// flight); "" when nothing does.
func notYet(st *state, n int, strategy sharding.Strategy) (string, error) {
	owner := lockOwners(st, n)
	unowned, first := 0, -1
	for s, id := range owner {
		if id == "" {
			unowned++
			if first < 0 {
				first = s
			}
		}
	}
	var why []string
	if len(st.runners) == 0 {
		why = append(why, "no runner registered")
	}
	if unowned > 0 {
		why = append(why, fmt.Sprintf("%d of %d shards not owned by a registered runner (shard %d first)", unowned, n, first))
	}
	if strategy != nil && len(st.runners) > 0 {
		assigned, err := assignOf(strategy, n, members(st), owner)
		if err != nil {
			return "", fmt.Errorf("the assignment now: %w", err)
		}
		misplaced, example := 0, ""
		for s, id := range owner {
			if id != "" && id != assigned[s] {
				if misplaced == 0 {
					example = fmt.Sprintf("shard %d: owned by %s, assigned to %s", s, id, assigned[s])
				}
				misplaced++
			}
		}
		if misplaced > 0 {
			why = append(why, fmt.Sprintf("%d shards owned elsewhere than their assignee (%s)", misplaced, example))
		}
		if len(st.handoffs) > 0 {
			why = append(why, fmt.Sprintf("%d handoffs in flight", len(st.handoffs)))
		}
	}
	return strings.Join(why, "; "), nil
}

type shardsOpts struct {
	owner    string
	unowned  bool
	handoffs bool
	rng      string
}

func shardsFlags(fs *flag.FlagSet) any {
	f := &shardsOpts{}
	fs.StringVar(&f.owner, "owner", "", "only the shards owned by `runner`")
	fs.BoolVar(&f.unowned, "unowned", false, "only unowned shards")
	fs.BoolVar(&f.handoffs, "handoffs", false, "only shards with a handoff in flight")
	fs.StringVar(&f.rng, "range", "", "only shards `A-B` (inclusive) or one shard N")
	return f
}

// ShardRow is one shard in `shards -json`.
type ShardRow struct {
	Shard      sharding.ShardID `json:"shard"`
	Owner      string           `json:"owner,omitempty"`      // "" when unowned
	Registered bool             `json:"registered,omitempty"` // the owner's lease is a registered runner's
	Epoch      int64            `json:"epoch,omitempty"`
	Lease      string           `json:"lease,omitempty"`
	Handoff    string           `json:"handoff,omitempty"` // "phase from -> to"
}

func parseRange(s string, n int) (lo, hi int, err error) {
	if s == "" {
		return 0, n - 1, nil
	}
	a, b, isRange := strings.Cut(s, "-")
	if lo, err = strconv.Atoi(a); err == nil {
		hi = lo
		if isRange {
			hi, err = strconv.Atoi(b)
		}
	}
	if err != nil || lo < 0 || hi < lo || hi >= n {
		return 0, 0, fmt.Errorf("%w: -range %q: want A-B or N within 0..%d", errUsage, s, n-1)
	}
	return lo, hi, nil
}

func cmdShards(ctx context.Context, c *cluster, flags any, _ []string, stdout, _ io.Writer) error {
	f := flags.(*shardsOpts)
	lo, hi, err := parseRange(f.rng, c.o.shards)
	if err != nil {
		return err
	}
	st, err := c.read(ctx)
	if err != nil {
		return err
	}
	if f.owner != "" {
		if _, ok := st.runner(f.owner); !ok {
			return fmt.Errorf("no runner %q is registered (runners: %s)", f.owner, st.runnerIDs())
		}
	}
	rows := []ShardRow{}
	for s := lo; s <= hi; s++ {
		id := sharding.ShardID(s)
		row := ShardRow{Shard: id}
		if l, ok := st.locks[id]; ok {
			row.Owner, row.Registered = st.owner(l)
			row.Epoch, row.Lease = int64(l.Epoch), fmt.Sprintf("%x", l.Lease)
		}
		if h, ok := st.handoffs[id]; ok {
			row.Handoff = fmt.Sprintf("%s %s -> %s", h.Phase, h.From, h.To)
		}
		switch {
		case f.owner != "" && (row.Owner != f.owner || !row.Registered):
		case f.unowned && row.Owner != "":
		case f.handoffs && row.Handoff == "":
		default:
			rows = append(rows, row)
		}
	}
	if c.o.json {
		return printJSON(stdout, rows)
	}
	tw := table(stdout)
	fmt.Fprintln(tw, "SHARD\tOWNER\tEPOCH\tLEASE\tHANDOFF")
	for _, r := range rows {
		owner, epoch := "-", "-"
		if r.Owner != "" {
			owner, epoch = r.Owner, strconv.FormatInt(r.Epoch, 10)
			if !r.Registered {
				owner += " (lease of no registered runner)"
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", r.Shard, owner, epoch, orDash(r.Lease), orDash(r.Handoff))
	}
	tw.Flush()
	fmt.Fprintf(stdout, "%d shards\n", len(rows))
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
