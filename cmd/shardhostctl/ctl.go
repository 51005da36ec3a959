package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// Environment variables that give the flags' defaults.
const (
	envEndpoints = "SHARDHOST_ETCD"
	envNamespace = "SHARDHOST_NAMESPACE"
	envShards    = "SHARDHOST_SHARDS"
)

// defaultShards is runner.DefaultNumShards (not imported: the command
// needs nothing of package runner).
const defaultShards = 1024

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// errUsage marks a usage error (exit status 2).
var errUsage = errors.New("usage")

const usageText = `usage: shardhostctl [flags] COMMAND [args]

commands:
  status                 runners, shard counts, unowned shards, handoffs in flight
  shards                 owner and epoch of every shard; filters:
                           -owner RUNNER  -unowned  -handoffs  -range A-B
  drain RUNNER [-wait]   request that RUNNER take no shard (kept in etcd, also across its
                         restarts): its shards move to the others by handoff;
                         -wait: until it owns none (at most -wait-timeout); -reason TEXT
  undrain RUNNER         withdraw the request: RUNNER takes shards again
  where KIND ID          the shard of entity ID and its owner

flags (before or after the command):
`

// options are the flags every command takes.
type options struct {
	endpoints string
	namespace string
	shards    int
	timeout   time.Duration
	json      bool
}

func defaultOptions() options {
	o := options{endpoints: "127.0.0.1:2379", shards: defaultShards, timeout: 5 * time.Second}
	if v := os.Getenv(envEndpoints); v != "" {
		o.endpoints = v
	}
	o.namespace = os.Getenv(envNamespace)
	if v, err := strconv.Atoi(os.Getenv(envShards)); err == nil {
		o.shards = v
	}
	return o
}

func (o *options) register(fs *flag.FlagSet) {
	fs.StringVar(&o.endpoints, "endpoints", o.endpoints, "etcd `host:port`s, comma-separated ($"+envEndpoints+")")
	fs.StringVar(&o.namespace, "namespace", o.namespace, "the cluster's `namespace` in etcd ($"+envNamespace+"; empty: the only one there)")
	fs.IntVar(&o.shards, "shards", o.shards, "NumShards of the cluster ($"+envShards+")")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "bound on each etcd call")
	fs.BoolVar(&o.json, "json", o.json, "print JSON")
}

// run executes one command line and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o := defaultOptions()
	global := flag.NewFlagSet("shardhostctl", flag.ContinueOnError)
	global.SetOutput(stderr)
	o.register(global)
	global.Usage = func() {
		fmt.Fprint(stderr, usageText)
		global.PrintDefaults()
	}
	if err := global.Parse(args); err != nil {
		return exitUsage
	}
	if global.NArg() == 0 {
		global.Usage()
		return exitUsage
	}
	name := global.Arg(0)
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "shardhostctl: unknown command %q\n", name)
		global.Usage()
		return exitUsage
	}
	fs := flag.NewFlagSet("shardhostctl "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.register(fs)
	sub := cmd.flags(fs)
	pos, err := parseInterleaved(fs, global.Args()[1:])
	if err != nil {
		return exitUsage
	}
	if len(pos) != cmd.args {
		fmt.Fprintf(stderr, "shardhostctl %s: want %d argument(s), got %d\n", name, cmd.args, len(pos))
		return exitUsage
	}
	if o.shards < 1 || o.shards > sharding.MaxShards {
		fmt.Fprintf(stderr, "shardhostctl: -shards %d: want 1..%d\n", o.shards, sharding.MaxShards)
		return exitUsage
	}
	c, err := connect(ctx, o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "shardhostctl: %v\n", err)
		return exitFail
	}
	defer c.close()
	if err := cmd.run(ctx, c, sub, pos, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "shardhostctl %s: %v\n", name, err)
		if errors.Is(err, errUsage) {
			return exitUsage
		}
		return exitFail
	}
	return exitOK
}

// parseInterleaved parses flags that may follow positional arguments
// ("drain runner-1 -wait") and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// command is one subcommand: flags registers its own flags and returns
// their values, run performs it.
type command struct {
	args  int
	flags func(*flag.FlagSet) any
	run   func(ctx context.Context, c *cluster, flags any, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{
	"status":  {args: 0, flags: noFlags, run: cmdStatus},
	"shards":  {args: 0, flags: shardsFlags, run: cmdShards},
	"drain":   {args: 1, flags: drainFlags, run: cmdDrain},
	"undrain": {args: 1, flags: noFlags, run: cmdUndrain},
	"where":   {args: 2, flags: noFlags, run: cmdWhere},
}

func noFlags(*flag.FlagSet) any { return nil }

// cluster is a connection to one namespace.
type cluster struct {
	o     options
	cli   *clientv3.Client
	store *etcd.Store
	ns    string
}

func (c *cluster) close() { _ = c.cli.Close() }

// ctx bounds one etcd call.
func (c *cluster) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.o.timeout)
}

// connect opens a client, checks that etcd answers and picks the namespace.
func connect(ctx context.Context, o options, stderr io.Writer) (*cluster, error) {
	var eps []string
	for e := range strings.SplitSeq(o.endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("%w: no etcd endpoint (-endpoints or $%s)", errUsage, envEndpoints)
	}
	cfg := etcd.ClientConfig(eps)
	cfg.DialTimeout = o.timeout
	cfg.Logger = zap.NewNop()
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", o.endpoints, err)
	}
	cctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	found, err := etcd.Namespaces(cctx, cli, 100000)
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("cannot reach etcd at %s within %v: %w (is etcd running there? set -endpoints or $%s)",
			o.endpoints, o.timeout, err, envEndpoints)
	}
	ns := o.namespace
	if ns == "" {
		switch len(found) {
		case 0:
			cli.Close()
			return nil, fmt.Errorf("etcd at %s holds no shardhost namespace (no runner has registered there); set -namespace or $%s", o.endpoints, envNamespace)
		case 1:
			ns = found[0]
			fmt.Fprintf(stderr, "shardhostctl: namespace %q (the only one at %s)\n", ns, o.endpoints)
		default:
			cli.Close()
			return nil, fmt.Errorf("etcd at %s holds several shardhost namespaces (%s): pick one with -namespace or $%s",
				o.endpoints, strings.Join(found, ", "), envNamespace)
		}
	}
	store, err := etcd.New(cli, ns, etcd.Config{OpTimeout: o.timeout})
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	return &cluster{o: o, cli: cli, store: store, ns: ns}, nil
}

// state is one reading of a namespace.
type state struct {
	rev      storage.Revision
	runners  []storage.Runner // valid records, by ID
	corrupt  []string         // keys of undecodable runner records
	byLease  map[storage.LeaseID]storage.Runner
	locks    map[sharding.ShardID]storage.Lock
	handoffs map[sharding.ShardID]storage.Handoff
	drains   map[string]storage.DrainRequest // by runner ID (a corrupt value still requests)
}

// read lists the namespace. It fails when the namespace holds nothing, or
// holds shards beyond -shards.
func (c *cluster) read(ctx context.Context) (*state, error) {
	st := &state{byLease: map[storage.LeaseID]storage.Runner{}, locks: map[sharding.ShardID]storage.Lock{},
		handoffs: map[sharding.ShardID]storage.Handoff{}, drains: map[string]storage.DrainRequest{}}
	var snaps [4]storage.Snapshot
	for i, ks := range []storage.Keyspace{storage.KeyspaceRunners, storage.KeyspaceShards, storage.KeyspaceHandoffs, storage.KeyspaceDrains} {
		cctx, cancel := c.ctx(ctx)
		snap, err := c.store.List(cctx, ks)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("read %s of namespace %q: %w", ks, c.ns, err)
		}
		snaps[i] = snap
		st.rev = max(st.rev, snap.Revision)
	}
	if len(snaps[0].KVs)+len(snaps[1].KVs)+len(snaps[2].KVs)+len(snaps[3].KVs) == 0 {
		hint := ""
		cctx, cancel := c.ctx(ctx)
		if found, err := etcd.Namespaces(cctx, c.cli, 100000); err == nil && len(found) > 0 {
			hint = "; namespaces with runners or locks there: " + strings.Join(found, ", ")
		}
		cancel()
		return nil, fmt.Errorf("namespace %q is empty at %s: no runner is registered and no shard is locked "+
			"(wrong -namespace, or every runner stopped)%s", c.ns, c.o.endpoints, hint)
	}
	for _, kv := range snaps[0].KVs {
		r, err := storage.DecodeRunner(kv)
		if err != nil {
			st.corrupt = append(st.corrupt, kv.Key)
			continue
		}
		st.runners = append(st.runners, r)
		st.byLease[r.Lease] = r
	}
	slices.SortFunc(st.runners, func(a, b storage.Runner) int { return strings.Compare(a.ID, b.ID) })
	for _, kv := range snaps[1].KVs {
		l, err := storage.DecodeLock(kv)
		if err != nil && l.Lease == storage.NoLease {
			continue // not even the key parses
		}
		if int(l.Shard) >= c.o.shards {
			return nil, fmt.Errorf("%w: shard %d is locked but -shards is %d: pass the cluster's NumShards with -shards or $%s",
				errUsage, l.Shard, c.o.shards, envShards)
		}
		st.locks[l.Shard] = l
	}
	for _, kv := range snaps[2].KVs {
		if h, err := storage.DecodeHandoff(kv); err == nil && int(h.Shard) < c.o.shards {
			st.handoffs[h.Shard] = h
		}
	}
	for _, kv := range snaps[3].KVs {
		if id, req, _ := storage.DecodeDrain(kv); id != "" {
			st.drains[id] = req
		}
	}
	return st, nil
}

// owner names the owner of a lock: the registered runner whose lease holds
// it, else the lock's value marked as not registered.
func (st *state) owner(l storage.Lock) (id string, registered bool) {
	if r, ok := st.byLease[l.Lease]; ok {
		return r.ID, true
	}
	return l.Owner.RunnerID, false
}

func (st *state) runner(id string) (storage.Runner, bool) {
	i := slices.IndexFunc(st.runners, func(r storage.Runner) bool { return r.ID == id })
	if i < 0 {
		return storage.Runner{}, false
	}
	return st.runners[i], true
}

func (st *state) runnerIDs() string {
	ids := make([]string, len(st.runners))
	for i, r := range st.runners {
		ids[i] = r.ID
	}
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}

// runnerState says how a runner takes part in the assignment: active,
// draining (an operator's request it published), drain requested (not
// published yet), shutting down (drains itself with weight 0), weight 0.
func runnerState(r storage.Runner, requested bool) string {
	switch {
	case r.Draining && r.Weight == 0:
		return "shutting down"
	case r.Draining:
		return "draining"
	case requested:
		return "drain requested"
	case r.Weight == 0:
		return "weight 0"
	default:
		return "active"
	}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// ---- status

// StatusRunner is one runner in `status -json`.
type StatusRunner struct {
	ID          string    `json:"id"`
	State       string    `json:"state"` // active, draining, drain requested, shutting down, weight 0
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
	Runners    []StatusRunner `json:"runners"`
	Corrupt    []string       `json:"corrupt_runner_records,omitempty"`
	Owned      int            `json:"owned"`
	Unowned    int            `json:"unowned"`
	Unknown    int            `json:"unknown_owner"` // locks under a lease of no registered runner
	Handoffs   int            `json:"handoffs"`
	Drains     []string       `json:"drain_requests"`   // runners with a drain request, registered or not
	HandoffsBy map[string]int `json:"handoffs_by_pair"` // "from -> to"
}

func cmdStatus(ctx context.Context, c *cluster, _ any, _ []string, stdout, _ io.Writer) error {
	st, err := c.read(ctx)
	if err != nil {
		return err
	}
	out := Status{Endpoints: c.o.endpoints, Namespace: c.ns, Revision: int64(st.rev), NumShards: c.o.shards,
		Runners: []StatusRunner{}, Corrupt: st.corrupt, HandoffsBy: map[string]int{}}
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
	fmt.Fprintf(stdout, "etcd %s, namespace %q, revision %d, %d shards\n\n", out.Endpoints, out.Namespace, out.Revision, out.NumShards)
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

// ---- shards

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

// ---- drain / undrain

type drainOpts struct {
	wait        bool
	waitTimeout time.Duration
	force       bool
	reason      string
}

func drainFlags(fs *flag.FlagSet) any {
	f := &drainOpts{}
	fs.BoolVar(&f.wait, "wait", false, "wait until the runner publishes the drain and owns no shard")
	fs.DurationVar(&f.waitTimeout, "wait-timeout", 2*time.Minute, "bound on -wait")
	fs.BoolVar(&f.force, "force", false, "drain even the last runner that can take shards")
	fs.StringVar(&f.reason, "reason", "", "free text stored with the request")
	return f
}

// requester names who asks: user@host.
func requester() string {
	user := os.Getenv("USER")
	if user == "" {
		user = "?"
	}
	host, _ := os.Hostname()
	return user + "@" + host
}

// DrainResult is `drain -json` and `undrain -json`.
type DrainResult struct {
	Runner     string  `json:"runner"`
	Requested  bool    `json:"requested"`  // a drain request exists now
	Changed    bool    `json:"changed"`    // this command created or deleted it
	Registered bool    `json:"registered"` // the runner is registered
	Shards     *int    `json:"shards,omitempty"`
	Waited     float64 `json:"waited_s,omitempty"`
}

func cmdDrain(ctx context.Context, c *cluster, flags any, args []string, stdout, stderr io.Writer) error {
	f := flags.(*drainOpts)
	id := args[0]
	if err := storage.ValidateRunnerID(id); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	st, err := c.read(ctx)
	if err != nil {
		return err
	}
	r, registered := st.runner(id)
	_, already := st.drains[id]
	if !already && registered && !f.force &&
		!slices.ContainsFunc(st.runners, func(o storage.Runner) bool { return o.ID != id && o.Weight > 0 && !o.Draining }) {
		return fmt.Errorf("runner %q is the last runner that can take shards: its shards would have nowhere to go (-force to drain anyway)", id)
	}
	res := DrainResult{Runner: id, Requested: true, Changed: !already, Registered: registered}
	if !already {
		cctx, cancel := c.ctx(ctx)
		_, err := c.store.RequestDrain(cctx, id, storage.DrainRequest{Requested: time.Now().UTC(), By: requester(), Reason: f.reason})
		cancel()
		if err != nil {
			return err
		}
	}
	if !c.o.json {
		switch {
		case already:
			fmt.Fprintf(stdout, "runner %s: drain already requested\n", id)
		case registered:
			fmt.Fprintf(stdout, "runner %s: drain requested; it publishes its record draining and its shards move to the other runners by handoff\n", id)
		default:
			fmt.Fprintf(stdout, "runner %s: drain requested; it is not registered now and will start drained (runners: %s)\n", id, st.runnerIDs())
		}
	}
	if f.wait && registered {
		start := time.Now()
		n, err := waitDrained(ctx, c, r, f.waitTimeout, stderr)
		res.Shards, res.Waited = &n, time.Since(start).Seconds()
		if err != nil {
			return err
		}
		if !c.o.json {
			fmt.Fprintf(stdout, "runner %s is draining and owns no shard (%.1fs)\n", id, res.Waited)
		}
	}
	if c.o.json {
		return printJSON(stdout, res)
	}
	return nil
}

// waitDrained polls until r's record says draining and no lock is under
// its lease, at most limit.
func waitDrained(ctx context.Context, c *cluster, r storage.Runner, limit time.Duration, progress io.Writer) (int, error) {
	deadline := time.Now().Add(limit)
	last := -1
	for {
		st, err := c.read(ctx)
		if err != nil {
			return last, err
		}
		if _, ok := st.drains[r.ID]; !ok {
			return last, fmt.Errorf("the drain request of %q was withdrawn meanwhile", r.ID)
		}
		cur, ok := st.runner(r.ID)
		n := 0
		if ok {
			for _, l := range st.locks {
				if l.Lease == cur.Lease {
					n++
				}
			}
		}
		if n != last {
			fmt.Fprintf(progress, "shardhostctl: %s owns %d shards\n", r.ID, n)
			last = n
		}
		if !ok || (cur.Draining && n == 0) {
			return n, nil // drained, or gone (it will start drained)
		}
		if time.Now().After(deadline) {
			return n, fmt.Errorf("runner %q still owns %d shards after %v (record draining: %v)", r.ID, n, limit, cur.Draining)
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func cmdUndrain(ctx context.Context, c *cluster, _ any, args []string, stdout, _ io.Writer) error {
	id := args[0]
	if err := storage.ValidateRunnerID(id); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	cctx, cancel := c.ctx(ctx)
	existed, err := c.store.CancelDrain(cctx, id)
	cancel()
	if err != nil {
		return err
	}
	st, err := c.read(ctx)
	registered := false
	shuttingDown := false
	if err == nil {
		r, ok := st.runner(id)
		registered, shuttingDown = ok, ok && r.Draining && r.Weight == 0
	}
	if c.o.json {
		return printJSON(stdout, DrainResult{Runner: id, Changed: existed, Registered: registered})
	}
	switch {
	case !existed:
		fmt.Fprintf(stdout, "runner %s had no drain request\n", id)
	default:
		fmt.Fprintf(stdout, "runner %s: drain request withdrawn; it takes shards again\n", id)
	}
	if shuttingDown {
		fmt.Fprintf(stdout, "note: runner %s is shutting down by itself (weight 0, draining)\n", id)
	}
	return nil
}

// ---- where

// Where is `where -json`.
type Where struct {
	Kind       string           `json:"kind"`
	ID         string           `json:"id"`
	Shard      sharding.ShardID `json:"shard"`
	Owner      string           `json:"owner,omitempty"`
	Registered bool             `json:"registered,omitempty"`
	Address    string           `json:"address,omitempty"`
	Epoch      int64            `json:"epoch,omitempty"`
	Handoff    string           `json:"handoff,omitempty"`
}

func cmdWhere(ctx context.Context, c *cluster, _ any, args []string, stdout, _ io.Writer) error {
	kind, id := args[0], args[1]
	if kind == "" || id == "" {
		return fmt.Errorf("%w: KIND and ID must not be empty", errUsage)
	}
	st, err := c.read(ctx)
	if err != nil {
		return err
	}
	w := Where{Kind: kind, ID: id, Shard: sharding.ShardOf(id, c.o.shards)}
	if l, ok := st.locks[w.Shard]; ok {
		w.Owner, w.Registered = st.owner(l)
		w.Epoch = int64(l.Epoch)
		if r, ok := st.byLease[l.Lease]; ok {
			w.Address = r.Address
		}
	}
	if h, ok := st.handoffs[w.Shard]; ok {
		w.Handoff = fmt.Sprintf("%s %s -> %s", h.Phase, h.From, h.To)
	}
	if c.o.json {
		return printJSON(stdout, w)
	}
	fmt.Fprintf(stdout, "%s %q -> shard %d of %d", kind, id, w.Shard, c.o.shards)
	switch {
	case w.Owner == "":
		fmt.Fprint(stdout, ", unowned (its messages wait for an owner)")
	case !w.Registered:
		fmt.Fprintf(stdout, ", locked by %s under a lease of no registered runner, epoch %d", w.Owner, w.Epoch)
	default:
		fmt.Fprintf(stdout, ", owned by %s (%s), epoch %d", w.Owner, w.Address, w.Epoch)
	}
	if w.Handoff != "" {
		fmt.Fprintf(stdout, ", handoff %s", w.Handoff)
	}
	fmt.Fprintln(stdout)
	return nil
}
