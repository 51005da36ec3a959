package registration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/shardhost/shardhost/storage"
)

var (
	// ErrDuplicateRunnerID: another live process registered this runner's
	// ID. Package runner re-exports it.
	ErrDuplicateRunnerID = errors.New("runner: another live process uses this runner ID")
	// ErrWaitingForID: the registration found the ID registered by another
	// process and waits for its lease to end (not a failure worth a retry
	// backoff or a log per attempt).
	ErrWaitingForID = errors.New("runner: waiting for the previous registration of this ID to expire")
)

// duplicateIDSlack is added to the holder's lease TTL when waiting for a
// crashed predecessor's record to expire: the store deletes expired leases
// on a timer (etcd checks every 500 ms) and the deletion must reach us.
const duplicateIDSlack = 2 * time.Second

// Store is the part of storage.Store the record is written with.
type Store interface {
	PutRunner(ctx context.Context, lease storage.LeaseID, rec storage.RunnerRecord) (storage.Revision, error)
	ReplaceRunner(ctx context.Context, lease storage.LeaseID, rec storage.RunnerRecord, at storage.Revision) (storage.Revision, error)
}

// Config identifies the runner whose record is kept.
type Config struct {
	ID          string
	Incarnation string
	// LeaseTTL bounds the wait for a holder that published no TTL.
	LeaseTTL time.Duration
}

// Observation is one observed state of runners/{ID} (the runners watch).
type Observation struct {
	Known  bool // observed at least once
	Exists bool
	KV     storage.KeyValue // when it exists
	Rev    storage.Revision // revision of the observation (the write, the delete, or a listing)
}

// Record is what a runner knows of its own record. Safe for concurrent
// use; it calls nothing of the runner.
type Record struct {
	cfg   Config
	key   string
	store Store
	log   *slog.Logger
	guard chan struct{} // 1-buffered: an observation (Repair may act)
	wait  chan struct{} // 1-buffered: an observation (a waiting Register may retry)

	mu   sync.Mutex
	want storage.RunnerRecord // the record the runner wrote last or is writing
	rev  storage.Revision     // revision of its last successful write
	seen Observation          // the latest state of the key in the runners watch
	// holder is the lease of another process's registration the runner
	// waits for (since); 0 when not waiting.
	holder storage.LeaseID
	since  time.Time
	// started is when the runner started (Start): of two live processes
	// registered under one ID, the one that started first keeps it.
	started time.Time
}

// New returns the record of runner cfg.ID, not written yet.
func New(cfg Config, store Store, log *slog.Logger) *Record {
	return &Record{
		cfg: cfg, key: storage.Key(storage.KeyspaceRunners, cfg.ID), store: store, log: log,
		guard: make(chan struct{}, 1), wait: make(chan struct{}, 1),
	}
}

// Start records when the runner started (its record's Started).
func (c *Record) Start(t time.Time) {
	c.mu.Lock()
	c.started = t
	c.mu.Unlock()
}

// Changed receives after an observation, for the goroutine repairing the
// record (Repair); Retry likewise for a registration that waits.
func (c *Record) Changed() <-chan struct{} { return c.guard }

// Retry receives after an observation: a waiting registration retries.
func (c *Record) Retry() <-chan struct{} { return c.wait }

// Observe records an observation of the key from the watch.
func (c *Record) Observe(o Observation) {
	o.Known = true
	c.mu.Lock()
	c.seen = o
	c.mu.Unlock()
	signal(c.guard)
	signal(c.wait)
}

// Seen returns the latest observation and the revision of the last write.
func (c *Record) Seen() (Observation, storage.Revision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen, c.rev
}

// Write writes rec under lease (PutRunner) as the record wanted, and
// notes the revision.
func (c *Record) Write(ctx context.Context, lease storage.LeaseID, rec storage.RunnerRecord) (storage.Revision, error) {
	c.mu.Lock()
	c.want = rec
	c.mu.Unlock()
	rev, err := c.store.PutRunner(ctx, lease, rec)
	if err == nil {
		c.NoteWritten(rev)
	}
	return rev, err
}

// NoteWritten records a write of the record at rev.
func (c *Record) NoteWritten(rev storage.Revision) {
	c.mu.Lock()
	c.rev = max(c.rev, rev)
	c.mu.Unlock()
}

// Register claims the key for lease (see the package rules). It returns
// the revision of the write, ErrWaitingForID while another process's
// registration may still expire, or ErrDuplicateRunnerID.
func (c *Record) Register(ctx context.Context, lease storage.LeaseID, rec storage.RunnerRecord) (storage.Revision, error) {
	for range 3 { // the key may change under us; three tries, then a retry later
		rev, err := c.Write(ctx, lease, rec)
		var ce *storage.RunnerConflictError
		if !errors.As(err, &ce) {
			c.mu.Lock()
			if err == nil {
				c.holder = storage.NoLease
			} else if c.holder != storage.NoLease {
				// The store did not answer: it may be electing a leader,
				// and etcd's new leader renews every lease for its TTL
				// — a crashed predecessor's too. The wait starts again.
				c.since = time.Now()
			}
			c.mu.Unlock()
			return rev, err
		}
		if !ce.Exists {
			continue // deleted meanwhile: claim it
		}
		other, derr := storage.DecodeRunner(ce.Existing)
		if derr == nil && ce.Existing.Lease != storage.NoLease && other.Incarnation != c.cfg.Incarnation {
			return 0, c.waitForID(other)
		}
		// Damage: corrupt, without a lease, or this incarnation's record
		// under a lease it no longer uses. Replace it where we saw it.
		why := "it has no lease"
		switch {
		case derr != nil:
			why = derr.Error()
		case ce.Existing.Lease != storage.NoLease:
			why = fmt.Sprintf("this incarnation's record under an old lease %x", ce.Existing.Lease)
		}
		c.log.Warn("replacing a damaged runner record", "key", c.key, "detail", why)
		rev, err = c.store.ReplaceRunner(ctx, lease, rec, ce.Existing.ModRevision)
		if errors.As(err, &ce) {
			continue
		}
		if err == nil {
			c.NoteWritten(rev)
		}
		return rev, err
	}
	return 0, fmt.Errorf("register: %s keeps changing", c.key)
}

// waitForID handles a valid registration of another process found at
// registration: wait (ErrWaitingForID) until its lease could have expired
// — its TTL and duplicateIDSlack since the record was first seen, or since
// the last registration attempt the store did not answer — then fail with
// ErrDuplicateRunnerID.
func (c *Record) waitForID(other storage.Runner) error {
	bound := other.LeaseTTL
	if bound <= 0 {
		bound = c.cfg.LeaseTTL
	}
	bound += duplicateIDSlack
	now := time.Now()
	c.mu.Lock()
	if c.holder != other.Lease {
		c.holder, c.since = other.Lease, now
		c.mu.Unlock()
		c.log.Warn("runner ID registered by another process; waiting for its lease to end (a crashed predecessor's expires within its TTL)",
			"key", c.key, "other_incarnation", other.Incarnation, "other_address", other.Address,
			"other_lease", fmt.Sprintf("%x", other.Lease), "at_most", bound)
		return ErrWaitingForID
	}
	waited := now.Sub(c.since)
	c.mu.Unlock()
	if waited < bound {
		return ErrWaitingForID
	}
	err := fmt.Errorf("%w: %s is registered by incarnation %s (address %q, lease %x), which kept its lease alive for %v",
		ErrDuplicateRunnerID, c.key, other.Incarnation, other.Address, other.Lease, waited.Round(time.Millisecond))
	c.log.Error("another live process uses this runner's ID; giving up", "key", c.key,
		"other_incarnation", other.Incarnation, "other_address", other.Address, "waited", waited.Round(time.Millisecond))
	return err
}

// sameRecord compares records, start times by instant (the stored form
// keeps neither the monotonic reading nor the location).
func sameRecord(a, b storage.RunnerRecord) bool {
	if !a.Started.Equal(b.Started) {
		return false
	}
	a.Started, b.Started = time.Time{}, time.Time{}
	return a == b
}

// recordDiff describes how a stored record differs from the wanted one.
func recordDiff(got, want storage.RunnerRecord, decodeErr error) string {
	if decodeErr != nil {
		return decodeErr.Error()
	}
	var d []string
	add := func(name string, g, w any) { d = append(d, fmt.Sprintf("%s %v, want %v", name, g, w)) }
	if got.Address != want.Address {
		add("address", fmt.Sprintf("%q", got.Address), fmt.Sprintf("%q", want.Address))
	}
	if got.Weight != want.Weight {
		add("weight", got.Weight, want.Weight)
	}
	if got.Draining != want.Draining {
		add("draining", got.Draining, want.Draining)
	}
	if got.Incarnation != want.Incarnation {
		add("incarnation", got.Incarnation, want.Incarnation)
	}
	if !got.Started.Equal(want.Started) {
		add("started", got.Started.UTC().Format(time.RFC3339Nano), want.Started.UTC().Format(time.RFC3339Nano))
	}
	if got.LeaseTTL != want.LeaseTTL {
		add("leaseTTL", got.LeaseTTL, want.LeaseTTL)
	}
	if got.DebugURL != want.DebugURL {
		add("debugURL", fmt.Sprintf("%q", got.DebugURL), fmt.Sprintf("%q", want.DebugURL))
	}
	return strings.Join(d, "; ")
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
