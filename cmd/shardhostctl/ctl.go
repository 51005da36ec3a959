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
	etcd      etcdSecurity // TLS and authentication (etcdflags.go)
}

func defaultOptions() options {
	o := options{endpoints: "127.0.0.1:2379", shards: defaultShards, timeout: 5 * time.Second, etcd: etcdSecurityFromEnv()}
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
	o.etcd.register(fs)
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
	if err := o.etcd.validate(); err != nil {
		fmt.Fprintf(stderr, "shardhostctl: %v\n", err)
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
		fmt.Fprintf(stderr, "shardhostctl %s: %v%s\n", name, err, deniedHint(err))
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
