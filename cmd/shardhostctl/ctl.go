package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/shardhost/shardhost/sharding"
)

// Environment variables that give the flags' defaults.
const (
	envEndpoints = "SHARDHOST_ETCD"
	envNamespace = "SHARDHOST_NAMESPACE"
	envShards    = "SHARDHOST_SHARDS"
)

// defaultShards is runner.DefaultNumShards (not imported: the command
// needs nothing of package runner), assumed only when the namespace holds
// no cluster record and neither -shards nor $SHARDHOST_SHARDS is set.
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
  status [-wait balanced|owned]
                         runners, shard counts, unowned shards, handoffs in flight;
                         -wait: first until every shard is owned by its assignee (balanced)
                         or by a registered runner (owned), at most -wait-timeout (exit 1
                         saying what is missing)
  shards                 owner and epoch of every shard; filters:
                           -owner RUNNER  -unowned  -handoffs  -range A-B
  drain RUNNER [-wait]   request that RUNNER take no shard (kept in etcd, also across its
                         restarts): its shards move to the others by handoff;
                         -wait: until it owns none (at most -wait-timeout); -reason TEXT
  undrain RUNNER         withdraw the request: RUNNER takes shards again
  where KIND ID          the shard of entity ID and its owner
  plan join RUNNER [-weight W] | leave RUNNER | drain RUNNER | weight RUNNER W
                         dry run: which shards would move, from whom to whom, and the
                         counts per runner, with the cluster's own strategy; -moves
                         lists every shard (writes nothing)
  singletons             every singleton's record: the runner that runs it, since when,
                         at which epoch, and whether that is the shard's owner now
  remembered [-forget KIND/ID]
                         the remembered entities of each shard, and the shard's owner;
                         -forget deletes one entity's marker, only while its shard has no
                         owner (an owner keeps it running: use entity.Forget there)
  reminders              the reminders stored for each shard, and the shard's owner

flags (before or after the command):
`

// options are the flags every command takes.
type options struct {
	endpoints string
	namespace string
	shards    int    // after connect: the shard count every command uses
	shardsSet bool   // -shards or $SHARDHOST_SHARDS was given: it overrides the cluster record
	strategy  string // the cluster record's strategy ("" when none is published)
	timeout   time.Duration
	json      bool
	etcd      etcdSecurity // TLS and authentication (etcdflags.go)
}

func defaultOptions() options {
	o := options{endpoints: "127.0.0.1:2379", shards: defaultShards, timeout: 5 * time.Second, etcd: etcdSecurityFromEnv()}
	if v := os.Getenv(envEndpoints); v != "" {
		o.endpoints = v
	}
	o.namespace = os.Getenv(envNamespace)
	if v, err := strconv.Atoi(os.Getenv(envShards)); err == nil {
		o.shards, o.shardsSet = v, true
	}
	return o
}

func (o *options) register(fs *flag.FlagSet) {
	fs.StringVar(&o.endpoints, "endpoints", o.endpoints, "etcd `host:port`s, comma-separated ($"+envEndpoints+")")
	fs.StringVar(&o.namespace, "namespace", o.namespace, "the cluster's `namespace` in etcd ($"+envNamespace+"; empty: the only one there)")
	fs.Var(shardsFlag{o}, "shards", "`N` shards instead of the cluster record's NumShards ($"+envShards+"; default: the record's, else 1024)")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "bound on each etcd call")
	fs.BoolVar(&o.json, "json", o.json, "print JSON")
	o.etcd.register(fs)
}

// shardsFlag is -shards: setting it marks the count as given, so it
// overrides the cluster record.
type shardsFlag struct{ o *options }

func (f shardsFlag) String() string {
	if f.o == nil || !f.o.shardsSet {
		return ""
	}
	return strconv.Itoa(f.o.shards)
}

func (f shardsFlag) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("not a number")
	}
	f.o.shards, f.o.shardsSet = n, true
	return nil
}

// run executes one command line and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o := defaultOptions()
	global := flag.NewFlagSet("shardhostctl", flag.ContinueOnError)
	global.SetOutput(stderr)
	o.register(global)
	global.Usage = func() {} // printed below: to stdout when asked for, to stderr after a mistake
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) { // -h, -help, --help: asked for, not a mistake
			printUsage(stdout, global, "")
			return exitOK
		}
		printUsage(stderr, global, "")
		return exitUsage
	}
	if global.NArg() > 0 && global.Arg(0) == "help" {
		printUsage(stdout, global, "")
		return exitOK
	}
	if global.NArg() == 0 {
		printUsage(stderr, global, "")
		return exitUsage
	}
	name := global.Arg(0)
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "shardhostctl: unknown command %q\n", name)
		printUsage(stderr, global, "")
		return exitUsage
	}
	fs := flag.NewFlagSet("shardhostctl "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	o.register(fs)
	sub := cmd.flags(fs)
	pos, err := parseInterleaved(fs, global.Args()[1:])
	if errors.Is(err, flag.ErrHelp) {
		printUsage(stdout, fs, name)
		return exitOK
	}
	if err != nil {
		printUsage(stderr, fs, name)
		return exitUsage
	}
	if cmd.args >= 0 && len(pos) != cmd.args {
		fmt.Fprintf(stderr, "shardhostctl %s: want %d argument(s), got %d\n", name, cmd.args, len(pos))
		return exitUsage
	}
	if err := o.etcd.validate(); err != nil {
		fmt.Fprintf(stderr, "shardhostctl: %v\n", err)
		return exitUsage
	}
	if o.shardsSet && (o.shards < 1 || o.shards > sharding.MaxShards) {
		fmt.Fprintf(stderr, "shardhostctl: -shards %d: want 1..%d\n", o.shards, sharding.MaxShards)
		return exitUsage
	}
	c, err := connect(ctx, o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "shardhostctl: %v\n", err)
		return exitFail
	}
	defer c.close()
	if err := c.readClusterRecord(ctx, stderr); err != nil {
		fmt.Fprintf(stderr, "shardhostctl: %v%s\n", err, deniedHint(err))
		return exitFail
	}
	if err := cmd.run(ctx, c, sub, pos, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "shardhostctl %s: %v%s\n", name, err, deniedHint(err))
		if errors.Is(err, errUsage) {
			return exitUsage
		}
		return exitFail
	}
	return exitOK
}

// printUsage prints the usage text and the flags of fs to w; name is the
// command whose flags fs holds ("" for the global ones).
func printUsage(w io.Writer, fs *flag.FlagSet, name string) {
	fmt.Fprint(w, usageText)
	if name != "" {
		fmt.Fprintf(w, "  (with the flags of %s)\n", name)
	}
	fs.SetOutput(w)
	fs.PrintDefaults()
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
	args  int // positional arguments; -1: the command checks them
	flags func(*flag.FlagSet) any
	run   func(ctx context.Context, c *cluster, flags any, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{
	"status":     {args: 0, flags: statusFlags, run: cmdStatus},
	"shards":     {args: 0, flags: shardsFlags, run: cmdShards},
	"drain":      {args: 1, flags: drainFlags, run: cmdDrain},
	"undrain":    {args: 1, flags: noFlags, run: cmdUndrain},
	"where":      {args: 2, flags: noFlags, run: cmdWhere},
	"plan":       {args: -1, flags: planFlags, run: cmdPlan},
	"singletons": {args: 0, flags: noFlags, run: cmdSingletons},
	"remembered": {args: 0, flags: rememberedFlags, run: cmdRemembered},
	"reminders":  {args: 0, flags: noFlags, run: cmdReminders},
}

func noFlags(*flag.FlagSet) any { return nil }

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// ---- status

// ---- shards

// ---- drain / undrain

// ---- where
