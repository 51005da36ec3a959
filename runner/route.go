package runner

import (
	"context"
	"fmt"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/routing"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Send delivers a call to its entity, wherever its shard is owned. It
// implements entity.Sender: use the typed Ask and Tell of method references
// rather than calling it. This is Send's contract, stated here only (the
// package doc and docs/guide.md link to it).
//
// Admission comes first: a ctx that has already ended fails the call at
// once with an error matching ctx's (context.Canceled or
// context.DeadlineExceeded), and no handler runs it, here or remotely. A
// call made before Run is called waits up to one second for the call
// (bounded by ctx too), so `go r.Run(ctx)` followed at once by an Ask
// works, and fails with ErrClosed if Run is not called by then; after
// Shutdown, Close or Run's return it fails at once with ErrClosed (joined
// with the error Run failed with, if any). A queued ask whose ctx ends
// before its handler starts is not run either.
//
// Routing follows what this runner knows of the shard's owner (the package
// doc, "Routing and delivery", says in which order): local delivery when
// this runner owns the shard at its current epoch, otherwise one hop to
// the owner it knows of (which never forwards), else to the runner the
// assignment names, which holds the call while it acquires the shard or
// answers NotOwner naming the owner it knows of (the package
// doc, "Routing and delivery", says for how long). Send
// retries, with jittered exponential backoff and a wake-up on every routing
// change, exactly the failures that guarantee the message reached no
// handler: not the owner (*NotOwnerError, following its owner hint), not
// delivered (*UndeliveredError: detached, shard moved, shutting down),
// owner not reachable before sending (ErrNotSent), and no owner yet
// (ErrNoOwner, whose message says why: the cluster not listed yet, with
// the last store failure; no runner registered; the shard unowned for as
// long as the send waited, and who it is assigned to). It gives up when
// ctx ends, returning ctx's cause joined with the last such error. An
// owner without a transport address cannot be reached from another
// runner: ErrNoTransport, at once.
//
// Delivery is at most once per call: any other error (a handler error, a
// timeout or a connection lost after sending: ErrMaybeDelivered) is
// returned as is, and the handler may have run — except for methods
// defined with entity.Idempotent, which are sent again, with backoff,
// after ErrMaybeDelivered (a *StaleResultError included) until an attempt
// succeeds or fails otherwise or ctx ends; the error that ends them still
// matches ErrMaybeDelivered, whatever the last attempt's says of itself.
//
// Routing is package routing's (internal/routing); the runner is its
// Directory (routingDir).
func (r *Runner) Send(ctx context.Context, c entity.Call) (any, error) { return r.router.Send(ctx, c) }

// routingDir is the runner's view of the cluster as routing reads it
// (routing.Directory).
type routingDir struct{ r *Runner }

var _ routing.Directory = routingDir{}

// Route returns the member owning shard id in this runner's view (its
// Address is "" if it serves no transport); ok is false when the shard is
// unowned, owned by a runner not in the membership, or owned by this runner
// but not hosted (in transition).
func (d routingDir) Route(id sharding.ShardID) (owner storage.Runner, ok bool) {
	r := d.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if to := r.shards.at(id).movedTo; to != "" { // we just handed it off
		if m, ok := r.view.members[to]; ok {
			return m, true
		}
	}
	l, held := r.view.locks.Get(id)
	if held {
		m, known := r.view.byLease[l.Lease]
		if !known || (m.ID == r.cfg.ID && m.Incarnation == r.incarnation) {
			return owner, false
		}
		return m, true
	}
	if to, tentative, ok := r.view.hints.route(id, time.Now()); ok && to != r.cfg.ID { // no full view: hints.go
		// A tentative route to the assignee itself is no route: the send
		// goes to the assignee as such (Assignee), naming the views it
		// saw, which the assignee may wait for (park.go).
		m, member := r.view.members[to]
		if member && !(tentative && r.view.assignment.Of(id) == to) {
			return m, true
		}
	}
	return owner, false
}

// ByAssignment reports whether this runner routes by the assignment (no
// full lock view): a shard's assignee is where its sends usually go, not
// a last resort.
func (d routingDir) ByAssignment() bool { return !d.r.view.full }

// Learned records what a send learned of shard id's owner: refusedBy
// answered "not the owner" naming owner ("" when it named none), or owner
// answered it (refusedBy ""). It routes later sends (hints.go).
func (d routingDir) Learned(id sharding.ShardID, owner, refusedBy string) {
	d.r.learned(id, owner, refusedBy)
}

// Assignee returns the member shard id is assigned to in this runner's
// view, when the shard has no live owner in it — its lock free, or under a
// lease no live member holds (a crashed owner's, until it expires) — and
// the assignee is another member with a transport address. ok is false
// otherwise: the cluster record not checked yet, no assignment known
// (before the first one), the assignee is
// this runner (it acquires the shard itself) or unknown, or a live runner
// holds the lock (Route names it, or it is this runner's, in transition).
// seen is the revisions of the views that say so (the request carries
// them: an assignee that has not seen as much yet waits for it, park.go).
func (d routingDir) Assignee(id sharding.ShardID) (m storage.Runner, seen routing.ViewSeen, ok bool) {
	r := d.r
	if !r.st.clusterChecked() {
		// An assignment computed before the cluster record was checked may
		// be of another NumShards: the send waits (and fails with the
		// mismatch, should there be one).
		return m, seen, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if int(id) >= r.view.assignment.Len() {
		return m, seen, false
	}
	if l, held := r.view.locks.Get(id); held {
		if _, live := r.view.byLease[l.Lease]; live || (l.Lease == r.att.lease && r.att.lease != 0) {
			return m, seen, false
		}
	}
	to := r.view.assignment.Of(id)
	if to == r.cfg.ID {
		return m, seen, false
	}
	m, ok = r.view.members[to]
	// Routing by the assignment, an assignee without a transport is the
	// shard's usual owner: the send fails with ErrNoTransport naming it.
	return m, r.view.seen, ok && (m.Address != "" || !r.view.full)
}

// Park waits while this runner acquires shard id, for a request that
// reached it before the install — or while its views are older than
// seen, those of a sender that aimed the request here as the shard's
// assignee (park.go) — and reports whether the shard is hosted here now.
func (d routingDir) Park(ctx context.Context, id sharding.ShardID, seen routing.ViewSeen) bool {
	return d.r.park(ctx, id, seen)
}

// Member returns the record of member id.
func (d routingDir) Member(id string) (storage.Runner, bool) {
	r := d.r
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.view.members[id]
	return m, ok
}

// NoRoute explains a shard with no route after waited: detached, ours in
// transition, or no owner known — and then why (noOwnerReason).
func (d routingDir) NoRoute(id sharding.ShardID, waited time.Duration) error {
	r := d.r
	r.mu.Lock()
	detached := r.lifecycle.phase == phaseDetached
	ours := r.shards.owner(id) != nil
	l, held := r.view.locks.Get(id)
	mine := held && l.Lease == r.att.lease && r.att.lease != 0
	r.mu.Unlock()
	switch {
	case detached:
		return &UndeliveredError{Shard: id, Cause: ErrDetached}
	case ours || mine:
		return &UndeliveredError{Shard: id, Cause: ErrShardMoved}
	default:
		return fmt.Errorf("%w: shard %d: %s", ErrNoOwner, id, r.noOwnerReason(id, waited))
	}
}

// NotHere is the error for a shard not hosted here.
func (d routingDir) NotHere(id sharding.ShardID) error { return d.r.notHere(id) }

// LeaseEndsByDrain reports whether lease is a live member's, or one whose
// record said Stopped before it ended (a clean Shutdown).
func (d routingDir) LeaseEndsByDrain(lease storage.LeaseID) bool {
	d.r.mu.Lock()
	defer d.r.mu.Unlock()
	_, live := d.r.view.byLease[lease]
	return live || d.r.view.stopped.has(lease)
}

func (d routingDir) Running() bool { return d.r.running.Load() }

func (d routingDir) WaitRun(ctx context.Context) error { return d.r.waitRun(ctx) }

func (d routingDir) ClosedErr() error { return d.r.closedErr() }
