package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/shardhost/shardhost/storage"
)

// drain and undrain: asking a runner to hand its shards over, and back.

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
