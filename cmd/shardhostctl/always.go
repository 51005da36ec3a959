package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// singletons and remembered: where each singleton runs, since when, and
// how many remembered entities each shard keeps.

// Singleton is one row of `singletons -json`.
type Singleton struct {
	Name   string           `json:"name"`
	Shard  sharding.ShardID `json:"shard"`
	Runner string           `json:"runner"` // the runner that last started it
	Since  time.Time        `json:"since"`
	Epoch  int64            `json:"epoch"` // the shard's epoch on that runner
	// State: running (its record's epoch is the shard lock's), stale (the
	// shard is owned at another epoch: its runner crashed or lost it, and
	// the new owner has not started it yet — or does not register it), or
	// unowned (no lock).
	State string `json:"state"`
	Owner string `json:"owner,omitempty"` // the shard's owner now
	// LeaseEnds is set when the owner's lease is ending: the seconds etcd
	// gives it (whole seconds), once it has not been renewed for a third
	// of its TTL — its runner crashed, or is cut off from etcd.
	LeaseEnds *float64 `json:"lease_ends_s,omitempty"`
}

func cmdSingletons(ctx context.Context, c *cluster, _ any, _ []string, stdout, stderr io.Writer) error {
	st, err := c.readStored(ctx)
	if err != nil {
		return err
	}
	leases := leaseClock{c: c}
	cctx, cancel := c.ctx(ctx)
	snap, err := c.store.List(cctx, storage.KeyspaceSingletons)
	cancel()
	if err != nil {
		return fmt.Errorf("read the singleton records of namespace %q: %w", c.ns, err)
	}
	rows := make([]Singleton, 0, len(snap.KVs))
	for _, kv := range snap.KVs {
		rec, err := storage.DecodeSingleton(kv)
		if err != nil {
			fmt.Fprintf(stderr, "warning: %v\n", err)
			continue
		}
		row := Singleton{Name: rec.Name, Shard: rec.Shard, Runner: rec.Runner, Since: rec.Started, Epoch: int64(rec.Epoch), State: "unowned"}
		if l, ok := st.locks[rec.Shard]; ok {
			row.Owner, _ = st.owner(l)
			row.State = "stale"
			if l.Epoch == rec.Epoch {
				row.State = "running"
			}
			row.LeaseEnds = leases.ending(ctx, l.Lease)
		}
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(a, b Singleton) int { return strings.Compare(a.Name, b.Name) })
	if c.o.json {
		return printJSON(stdout, rows)
	}
	if len(rows) == 0 {
		fmt.Fprintln(stdout, "no singleton has started in this namespace")
		return nil
	}
	tw := table(stdout)
	fmt.Fprintln(tw, "NAME\tSHARD\tRUNNER\tSINCE\tEPOCH\tSTATE")
	for _, r := range rows {
		state := r.State
		if r.State == "stale" {
			state += " (shard owned by " + r.Owner + ")"
		}
		state += leaseNote(r.LeaseEnds)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\n", r.Name, r.Shard, r.Runner, r.Since.Local().Format(time.DateTime), r.Epoch, state)
	}
	return tw.Flush()
}

// RememberedShard is one row of `remembered -json` (and of `reminders
// -json`: Count is then the shard's reminders).
type RememberedShard struct {
	Shard sharding.ShardID `json:"shard"`
	Count int              `json:"count"`
	Owner string           `json:"owner,omitempty"`
	// LeaseEnds: as Singleton.LeaseEnds, of the owner's lease.
	LeaseEnds *float64 `json:"lease_ends_s,omitempty"`
}

// rememberedPage is how many keys one read of the remembered markers or
// reminders returns (keys only).
const rememberedPage = 10000

type rememberedOpts struct{ forget string }

func rememberedFlags(fs *flag.FlagSet) any {
	f := &rememberedOpts{}
	fs.StringVar(&f.forget, "forget", "", "delete the marker of the remembered entity `KIND/ID` (its shard must have no owner: see the usage)")
	return f
}

func cmdRemembered(ctx context.Context, c *cluster, flags any, _ []string, stdout, stderr io.Writer) error {
	if f := flags.(*rememberedOpts); f.forget != "" {
		return forgetRemembered(ctx, c, f.forget, stdout)
	}
	return perShard(ctx, c, storage.KeyspaceRemembered, "remembered entities", "REMEMBERED", stdout)
}

func cmdReminders(ctx context.Context, c *cluster, _ any, _ []string, stdout, _ io.Writer) error {
	return perShard(ctx, c, storage.KeyspaceReminders, "reminders", "REMINDERS", stdout)
}

// perShard counts the entities' records of keyspace ks
// ({ks}/{shard}/{kind%2Fid}[/...]) per shard, with each shard's owner; a
// shard's own record ({ks}/{shard}: the reminders' progress) is not
// counted.
func perShard(ctx context.Context, c *cluster, ks storage.Keyspace, what, column string, stdout io.Writer) error {
	st, err := c.readStored(ctx)
	if err != nil {
		return err
	}
	prefix := "/" + c.ns + "/" + string(ks) + "/"
	counts := map[sharding.ShardID]int{}
	total := 0
	from := prefix
	end := clientv3.GetPrefixRangeEnd(prefix)
	for {
		cctx, cancel := c.ctx(ctx)
		resp, err := c.cli.Get(cctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(rememberedPage),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		cancel()
		if err != nil {
			return fmt.Errorf("read the %s of namespace %q: %w", what, c.ns, err)
		}
		for _, kv := range resp.Kvs {
			rest := strings.TrimPrefix(string(kv.Key), prefix)
			shardPart, entity, _ := strings.Cut(rest, "/")
			if id, err := sharding.ParseShardID(shardPart); err == nil && entity != "" {
				counts[id]++
				total++
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	leases := leaseClock{c: c}
	rows := make([]RememberedShard, 0, len(counts))
	for id, n := range counts {
		row := RememberedShard{Shard: id, Count: n}
		if l, ok := st.locks[id]; ok {
			row.Owner, _ = st.owner(l)
			row.LeaseEnds = leases.ending(ctx, l.Lease)
		}
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(a, b RememberedShard) int { return int(a.Shard) - int(b.Shard) })
	if c.o.json {
		return printJSON(stdout, rows)
	}
	fmt.Fprintf(stdout, "%s: %d in %d shards", what, total, len(rows))
	if len(st.runners) == 0 {
		fmt.Fprint(stdout, " (no runner registered: what is stored)")
	}
	fmt.Fprintln(stdout)
	if len(rows) == 0 {
		return nil
	}
	tw := table(stdout)
	fmt.Fprintf(tw, "SHARD\t%s\tOWNER\n", column)
	for _, r := range rows {
		owner := r.Owner
		if owner == "" {
			owner = "(unowned)"
		}
		fmt.Fprintf(tw, "%d\t%d\t%s%s\n", r.Shard, r.Count, owner, leaseNote(r.LeaseEnds))
	}
	return tw.Flush()
}

// forgetRemembered deletes the marker of the remembered entity ref
// ("KIND/ID") in one transaction conditional on its shard having no lock.
// A shard with an owner keeps its remembered entities in memory and
// running: deleting the marker behind its back would leave the store and
// the running owner disagreeing until the shard moves, so the command
// refuses, naming the owner (forget it from the entity: entity.Forget, or
// stop the owner). Forgetting a marker that is not there succeeds (it
// prints so).
func forgetRemembered(ctx context.Context, c *cluster, ref string, stdout io.Writer) error {
	kind, id, ok := strings.Cut(ref, "/")
	if !ok || kind == "" || id == "" {
		return fmt.Errorf("%w: -forget %q: want KIND/ID", errUsage, ref)
	}
	e := storage.EntityRef{Kind: kind, ID: id}
	shard := sharding.ShardOf(id, c.o.shards)
	marker := "/" + c.ns + "/" + storage.RememberedKey(shard, e)
	lock := "/" + c.ns + "/" + string(storage.KeyspaceShards) + "/" + shard.String()
	cctx, cancel := c.ctx(ctx)
	resp, err := c.cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(lock), "=", 0)).
		Then(clientv3.OpDelete(marker)).Commit()
	cancel()
	if err != nil {
		return fmt.Errorf("forget %s (shard %d): %w", e, shard, etcd.TranslateError(err))
	}
	if !resp.Succeeded {
		owner := "a lock"
		if st, err := c.readStored(ctx); err == nil {
			if l, ok := st.locks[shard]; ok {
				id, registered := st.owner(l)
				owner = fmt.Sprintf("runner %q", id)
				if !registered {
					owner += " (not registered: a crashed incarnation's lock, until its lease ends)"
				}
			}
		}
		return fmt.Errorf("%w: shard %d of %s is owned by %s, which keeps its remembered entities running: "+
			"forget it from the entity (entity.Forget in one of its handlers), or run this when the shard has no owner "+
			"(every runner stopped, or the owner's lease ended)", errOwned, shard, e, owner)
	}
	n := resp.Responses[0].GetResponseDeleteRange().Deleted
	if c.o.json {
		return printJSON(stdout, map[string]any{"entity": e.String(), "shard": shard, "deleted": n})
	}
	if n == 0 {
		fmt.Fprintf(stdout, "%s (shard %d) was not remembered: nothing to forget\n", e, shard)
		return nil
	}
	fmt.Fprintf(stdout, "forgot %s (shard %d): its shard's next owner does not start it without a message\n", e, shard)
	return nil
}

// errOwned: the command needs a shard with no owner.
var errOwned = errors.New("shard owned")

// leaseClock reads, once per lease, how long a lease has left.
type leaseClock struct {
	c    *cluster
	seen map[storage.LeaseID]*float64
}

// ending returns the seconds lease has left when it has not been renewed
// for a third of its TTL (a runner renews every sixth of it): its runner
// crashed or is cut off, and the lease ends then. nil when it is renewed,
// or cannot be read.
func (lc *leaseClock) ending(ctx context.Context, lease storage.LeaseID) *float64 {
	if v, ok := lc.seen[lease]; ok {
		return v
	}
	if lc.seen == nil {
		lc.seen = map[storage.LeaseID]*float64{}
	}
	cctx, cancel := lc.c.ctx(ctx)
	resp, err := lc.c.cli.TimeToLive(cctx, clientv3.LeaseID(lease))
	cancel()
	var v *float64
	if err == nil && resp.GrantedTTL > 0 && resp.TTL*3 < resp.GrantedTTL*2 {
		left := float64(max(resp.TTL, 0))
		v = &left
	}
	lc.seen[lease] = v
	return v
}

// leaseNote is the text for a lease about to end ("" otherwise).
func leaseNote(left *float64) string {
	if left == nil {
		return ""
	}
	return fmt.Sprintf(" (lease ends in %g s: not renewed)", *left)
}
