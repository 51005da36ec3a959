package main

import (
	"context"
	"fmt"
	"io"

	"github.com/shardhost/shardhost/sharding"
)

// where: which runner owns an entity's shard.

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
