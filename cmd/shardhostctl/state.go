package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// Connecting to the cluster and reading its state in one revision.

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
	if err := o.etcd.apply(&cfg); err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	cli, err := clientv3.New(cfg) // logs in when a user is given
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s (%s): %w%s%s", o.endpoints, o.etcd.describe(), etcd.TranslateError(err), deniedHint(err), tlsHint(ctx, eps[0], cfg.TLS, err))
	}
	ns := o.namespace
	var found []string
	if ns != "" {
		// Only the namespace's keys are read: a role limited to its prefix
		// may not list the others.
		cctx, cancel := context.WithTimeout(ctx, o.timeout)
		_, err = etcd.Namespaces(cctx, cli, 1) // proves etcd answers (and the credentials)
		cancel()
		if errors.Is(err, storage.ErrPermissionDenied) {
			err = nil // may not list "/": the namespace's own reads tell
		}
	} else {
		cctx, cancel := context.WithTimeout(ctx, o.timeout)
		found, err = etcd.Namespaces(cctx, cli, 100000)
		cancel()
	}
	if err != nil {
		cli.Close()
		if errors.Is(err, storage.ErrPermissionDenied) {
			return nil, fmt.Errorf("etcd at %s (%s) refused to list its keys: %w%s; with a role limited to a namespace, set -namespace or $%s",
				o.endpoints, o.etcd.describe(), err, deniedHint(err), envNamespace)
		}
		return nil, fmt.Errorf("cannot reach etcd at %s within %v (%s): %w%s (is etcd running there? set -endpoints or $%s; TLS: -cacert, -cert, -key; auth: -user, -password)",
			o.endpoints, o.timeout, o.etcd.describe(), err, tlsHint(ctx, eps[0], cfg.TLS, err), envEndpoints)
	}
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

// readClusterRecord settles the shard count and strategy from the
// namespace's cluster record (the settings every runner of the cluster
// checked at start). A -shards (or $SHARDHOST_SHARDS) that disagrees with
// the record still wins, with a warning: it is how one looks at a cluster
// whose record was deleted or rewritten. Without a record the count is
// -shards or the default, with a note saying so.
func (c *cluster) readClusterRecord(ctx context.Context, stderr io.Writer) error {
	cctx, cancel := c.ctx(ctx)
	info, ok, err := c.store.ReadCluster(cctx)
	cancel()
	switch {
	case err != nil && !ok:
		return fmt.Errorf("read the cluster record of namespace %q: %w", c.ns, err)
	case err != nil: // present but damaged: say so, go on with -shards or the default
		fmt.Fprintf(stderr, "shardhostctl: warning: the cluster record of namespace %q is damaged (%v); using %d shards%s\n",
			c.ns, err, c.o.shards, shardsOrigin(c.o))
	case !ok:
		fmt.Fprintf(stderr, "shardhostctl: namespace %q has no cluster record (no runner has started there yet); using %d shards%s\n",
			c.ns, c.o.shards, shardsOrigin(c.o))
	default:
		c.o.strategy = info.Strategy
		if !c.o.shardsSet {
			c.o.shards = info.NumShards
		} else if c.o.shards != info.NumShards {
			by := ""
			if info.WrittenBy != "" {
				by = fmt.Sprintf(", published by runner %q", info.WrittenBy)
			}
			fmt.Fprintf(stderr, "shardhostctl: warning: -shards %d overrides the cluster record's NumShards %d%s: "+
				"shard numbers and counts below are computed for %d shards, not the cluster's\n",
				c.o.shards, info.NumShards, by, c.o.shards)
		}
	}
	return nil
}

// shardsOrigin names where a shard count that is not the record's came from.
func shardsOrigin(o options) string {
	if o.shardsSet {
		return " (-shards or $" + envShards + ")"
	}
	return " (the default; -shards or $" + envShards + " to change)"
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

// read lists the namespace. It fails when the namespace holds no runner,
// lock, handoff or drain request, or holds shards beyond -shards.
func (c *cluster) read(ctx context.Context) (*state, error) { return c.readState(ctx, false) }

// readStored is read for the commands that show what is stored beside the
// runners (remembered entities, singleton records, reminders): a namespace
// with no runner registered and no lock is not an error for them — it is
// a stopped cluster, whose stored state they list with no owner.
func (c *cluster) readStored(ctx context.Context) (*state, error) { return c.readState(ctx, true) }

func (c *cluster) readState(ctx context.Context, stopped bool) (*state, error) {
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
	if len(snaps[0].KVs)+len(snaps[1].KVs)+len(snaps[2].KVs)+len(snaps[3].KVs) == 0 && !stopped {
		hint := ""
		cctx, cancel := c.ctx(ctx)
		if found, err := etcd.Namespaces(cctx, c.cli, 100000); err == nil && len(found) > 0 {
			hint = "; namespaces with shardhost keys there: " + strings.Join(found, ", ")
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
			return nil, fmt.Errorf("%w: shard %d is locked but the shard count is %d%s: pass the cluster's NumShards with -shards or $%s",
				errUsage, l.Shard, c.o.shards, shardsOrigin(c.o), envShards)
		}
		st.locks[l.Shard] = l
	}
	for _, kv := range snaps[2].KVs {
		if h, err := storage.DecodeHandoffListed(kv); err == nil && int(h.Shard) < c.o.shards {
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
// published yet), shutting down (drains itself with weight 0), stopped
// (a clean Shutdown released every shard and is revoking its lease),
// weight 0.
func runnerState(r storage.Runner, requested bool) string {
	switch {
	case r.Stopped:
		return "stopped"
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
