// Command carts shows shardhost's durable reminders and timers: shopping
// carts that expire after a few seconds without an item added (a one-shot
// reminder re-registered on every Add), nudge the shopper once (an
// in-memory timer), and a summary entity that reports every 2 s on a
// periodic reminder — nightly in a real shop. Three runners and a gateway
// run on an embedded etcd; while carts wait to expire, one runner shuts
// down gracefully (its reminders move with their shards, exactly once)
// and another crashes (its reminders fire again on the new owner, marked
// Redelivered: the cart applies an expiry once). Then every cart is
// checked: each abandoned cart expired, never early; no checked-out cart
// expired.
//
//	cd examples && go run ./carts [-etcd host:port] [-carts 200] [-v]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/shardhost/shardhost/examples/internal/demo"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

const (
	numShards = 64
	leaseTTL  = 3 * time.Second
)

type options struct {
	etcd    string
	carts   int
	verbose bool
	out     io.Writer
	logs    io.Writer
}

func main() {
	o := options{out: os.Stdout, logs: os.Stderr}
	demo.RegisterFlags(&o.etcd, &o.verbose)
	flag.IntVar(&o.carts, "carts", 200, "carts, half of them abandoned")
	demo.Main("carts", func(ctx context.Context) (bool, error) {
		r, err := run(ctx, o)
		return err == nil && len(r.Problems) > 0, err
	})
}

// result is a run's outcome.
type result struct {
	Abandoned, CheckedOut int
	Expired               int // abandoned carts that expired
	Redelivered           int // expiries marked Redelivered (the crashed runner's carts)
	Duplicates            int // expiries fired again for a cart already expired (applied once)
	OnCrashed             int // abandoned carts on the crashed runner
	Summaries             int
	Problems              []string
}

func run(ctx context.Context, o options) (_ *result, err error) {
	say := demo.Say(o.out)
	e, err := demo.OpenEtcd(o.etcd, o.verbose, say, "carts")
	if err != nil {
		return nil, err
	}
	defer e.Close()
	endpoints, namespace := []string{e.Endpoint}, e.Namespaces[0]

	var nodes []*demo.Node
	defer func() {
		_, serr := demo.StopAll(nodes)
		err = errors.Join(serr, err)
	}()
	logger := demo.NewLogger(o.logs, o.verbose)
	for _, cfg := range []runner.Config{
		{ID: "runner-1", ListenAddr: "127.0.0.1:0"},
		{ID: "runner-2", ListenAddr: "127.0.0.1:0"},
		{ID: "runner-3", ListenAddr: "127.0.0.1:0"},
		{ID: "gateway", ClientOnly: true},
	} {
		cfg.NumShards, cfg.LeaseTTL, cfg.Logger = numShards, leaseTTL, logger
		n, err := demo.StartNode(endpoints, namespace, cfg, CartKind, nil, o.verbose)
		if err != nil {
			return nil, err
		}
		if err := n.Runner().Register(SummaryKind); err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	r1, r2, r3, gw := nodes[0], nodes[1], nodes[2], nodes[3]
	settle, err := demo.WaitSettled(ctx, []*demo.Node{r1, r2, r3}, gw, numShards, 30*time.Second)
	if err != nil {
		return nil, err
	}
	say("3 runners + gateway started; shards settled in %v", demo.Round(settle))
	if _, err := Arm.Ask(ctx, gw.Runner(), "today", struct{}{}); err != nil {
		return nil, fmt.Errorf("arm the summary: %w", err)
	}

	// Shoppers: every cart gets two items; even carts check out, odd
	// carts are abandoned and must expire idle after their last item.
	res := &result{}
	for i := range o.carts {
		id := fmt.Sprintf("cart-%03d", i)
		for _, sku := range []string{"book", "pen"} {
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := Add.Ask(actx, gw.Runner(), id, AddReq{SKU: sku})
			cancel()
			if err != nil {
				return nil, fmt.Errorf("add to %s: %w", id, err)
			}
		}
		if i%2 == 0 {
			if _, err := Checkout.Ask(ctx, gw.Runner(), id, CheckoutReq{}); err != nil {
				return nil, fmt.Errorf("checkout %s: %w", id, err)
			}
			res.CheckedOut++
		} else {
			res.Abandoned++
		}
	}
	say("%d carts filled: %d checked out, %d abandoned (each expires %v after its last item)", o.carts, res.CheckedOut, res.Abandoned, idle)

	// While the abandoned carts wait: a graceful stop, then a crash.
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = r2.Stop(sctx)
	cancel()
	if err != nil {
		return nil, err
	}
	if _, err := demo.WaitSettled(ctx, []*demo.Node{r1, r3}, gw, numShards, 30*time.Second); err != nil {
		return nil, err
	}
	say("runner-2 shut down gracefully: its carts' reminders moved with their shards")
	owned3 := r3.Runner().Owned()
	for i := 1; i < o.carts; i += 2 {
		if _, on := owned3[sharding.ShardOf(fmt.Sprintf("cart-%03d", i), numShards)]; on {
			res.OnCrashed++
		}
	}
	if err := r3.Crash(); err != nil {
		return nil, err
	}
	crashed := time.Now()
	say("runner-3 crashed with %d abandoned carts; its lease (%v TTL) runs out", res.OnCrashed, leaseTTL)
	if _, err := demo.WaitSettled(ctx, []*demo.Node{r1}, gw, numShards, 30*time.Second); err != nil {
		return nil, err
	}
	say("runner-1 owns all %d shards %v after the crash", numShards, demo.Round(time.Since(crashed)))
	if err := demo.Sleep(ctx, idle+2*summaryPeriod); err != nil {
		return nil, err
	}
	check(res, o.carts)
	report(o.out, res)
	return res, nil
}

// check reads the journal: every abandoned cart expired once (applied once
// even when redelivered), never before its due time; no checked-out cart
// expired; the summary reported.
func check(res *result, carts int) {
	journal.mu.Lock()
	defer journal.mu.Unlock()
	problem := func(format string, args ...any) { res.Problems = append(res.Problems, fmt.Sprintf(format, args...)) }
	for i := range carts {
		id := fmt.Sprintf("cart-%03d", i)
		var lastAdd cartEvent
		expired := 0
		for _, ev := range journal.events[id] {
			switch ev.What {
			case "add":
				lastAdd = ev
			case "expire":
				expired++
				if ev.Redelivered {
					res.Redelivered++
				}
				if ev.At.Before(lastAdd.Due) {
					problem("%s expired at %s, before its due time %s", id, ev.At.Format("15:04:05.000"), lastAdd.Due.Format("15:04:05.000"))
				}
			case "expire-duplicate":
				res.Duplicates++
				if !ev.Redelivered {
					problem("%s: an expiry fired twice without Redelivered", id)
				}
			}
		}
		switch {
		case i%2 == 0 && expired > 0:
			problem("%s was checked out and expired anyway", id)
		case i%2 == 1 && expired == 0:
			problem("%s was abandoned and never expired", id)
		case i%2 == 1:
			res.Expired++
		}
	}
	res.Summaries = len(journal.summaries)
	if res.Summaries < 2 {
		problem("the summary reminder fired %d times", res.Summaries)
	}
	total := Outcome{}
	for _, s := range journal.summaries {
		total.Expired += s.Expired
		total.CheckedOut += s.CheckedOut
	}
	if total.CheckedOut != res.CheckedOut {
		problem("the summaries reported %d checkouts, want %d", total.CheckedOut, res.CheckedOut)
	}
}

func report(w io.Writer, res *result) {
	journal.mu.Lock()
	fmt.Fprintf(w, "\nsummary reminder (every %v):\n", summaryPeriod)
	fmt.Fprintf(w, "  %-5s %-9s %-10s %-8s %-12s\n", "tick", "runner", "expired", "checked", "redelivered")
	for _, s := range journal.summaries {
		fmt.Fprintf(w, "  %-5d %-9s %-10d %-8d %-12v\n", s.Tick, s.Runner, s.Expired, s.CheckedOut, s.Redelivered)
	}
	nudges := journal.nudges
	journal.mu.Unlock()
	fmt.Fprintf(w, "\ncarts: %d abandoned, %d expired (%d were on the crashed runner: %d expiries arrived marked Redelivered, %d fired twice and were applied once); %d checked out, none expired; %d nudge timers fired (in-memory timers end with their shard's move or crash)\n",
		res.Abandoned, res.Expired, res.OnCrashed, res.Redelivered, res.Duplicates, res.CheckedOut, nudges)
	if len(res.Problems) > 0 {
		fmt.Fprintf(w, "PROBLEMS:\n")
		for _, p := range res.Problems {
			fmt.Fprintf(w, "  %s\n", p)
		}
		return
	}
	fmt.Fprintln(w, "OK: every abandoned cart expired once, none early, no checked-out cart expired")
}
