package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
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
}

func cmdSingletons(ctx context.Context, c *cluster, _ any, _ []string, stdout, stderr io.Writer) error {
	st, err := c.read(ctx)
	if err != nil {
		return err
	}
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
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\n", r.Name, r.Shard, r.Runner, r.Since.Local().Format(time.DateTime), r.Epoch, state)
	}
	return tw.Flush()
}

// RememberedShard is one row of `remembered -json`.
type RememberedShard struct {
	Shard sharding.ShardID `json:"shard"`
	Count int              `json:"count"`
	Owner string           `json:"owner,omitempty"`
}

// rememberedPage is how many keys one read of the remembered markers
// returns (keys only).
const rememberedPage = 10000

func cmdRemembered(ctx context.Context, c *cluster, _ any, _ []string, stdout, _ io.Writer) error {
	st, err := c.read(ctx)
	if err != nil {
		return err
	}
	prefix := "/" + c.ns + "/" + string(storage.KeyspaceRemembered) + "/"
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
			return fmt.Errorf("read the remembered entities of namespace %q: %w", c.ns, err)
		}
		for _, kv := range resp.Kvs {
			rest := strings.TrimPrefix(string(kv.Key), prefix)
			shardPart, _, _ := strings.Cut(rest, "/")
			if id, err := sharding.ParseShardID(shardPart); err == nil {
				counts[id]++
				total++
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	rows := make([]RememberedShard, 0, len(counts))
	for id, n := range counts {
		row := RememberedShard{Shard: id, Count: n}
		if l, ok := st.locks[id]; ok {
			row.Owner, _ = st.owner(l)
		}
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(a, b RememberedShard) int { return int(a.Shard) - int(b.Shard) })
	if c.o.json {
		return printJSON(stdout, rows)
	}
	fmt.Fprintf(stdout, "remembered entities: %d in %d shards\n", total, len(rows))
	if len(rows) == 0 {
		return nil
	}
	tw := table(stdout)
	fmt.Fprintln(tw, "SHARD\tREMEMBERED\tOWNER")
	for _, r := range rows {
		owner := r.Owner
		if owner == "" {
			owner = "(unowned)"
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\n", r.Shard, r.Count, owner)
	}
	return tw.Flush()
}
