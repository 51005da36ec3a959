package memory

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/shardhost/shardhost/storage"
)

// Fault injection and call counting: every call is admitted through
// faults (delay, partition, failure, a closed cluster) before it touches
// the cluster.

// Op names a kind of call, for fault injection and call counting.
type Op string

// The operations of a Store.
const (
	OpGrant      Op = "grant"
	OpKeepAlive  Op = "keepalive"
	OpRevoke     Op = "revoke"
	OpPutRunner  Op = "put-runner"
	OpAcquire    Op = "acquire"
	OpVerify     Op = "verify"
	OpRelease    Op = "release"
	OpRewrite    Op = "rewrite"
	OpTransfer   Op = "transfer"
	OpHandoff    Op = "handoff"
	OpCheckpoint Op = "checkpoint"
	OpShardState Op = "shard-state" // ReadShardStates and WriteShardStates
	OpCluster    Op = "cluster"     // ReadCluster and WriteCluster
	OpList       Op = "list"
	OpWatch      Op = "watch"
	OpPing       Op = "ping"
)

// Partition cuts this client off (on) or reconnects it (off). While cut off,
// calls block until their context ends and fail with storage.ErrUnavailable;
// watches deliver nothing and catch up after the partition heals.
func (s *Store) Partition(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on == s.partitioned {
		return
	}
	s.partitioned = on
	if on {
		s.healed = make(chan struct{})
	} else {
		close(s.healed)
	}
}

// BreakWatches ends every open watch of this client with
// storage.ErrUnavailable, as a lost connection does on etcd.
func (s *Store) BreakWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil {
		close(s.broken)
	}
	s.broken = make(chan struct{})
}

func (s *Store) brokenCh() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken == nil {
		s.broken = make(chan struct{})
	}
	return s.broken
}

// FailKeepAlive makes KeepAliveOnce fail at once with storage.ErrUnavailable
// (on) or work again (off).
func (s *Store) FailKeepAlive(on bool) {
	if on {
		s.Fail(OpKeepAlive, storage.ErrUnavailable)
	} else {
		s.Fail(OpKeepAlive, nil)
	}
}

// Fail makes every call of op fail at once with err (wrapped with the
// operation); a nil err removes the fault.
func (s *Store) Fail(op Op, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail == nil {
		s.fail = make(map[Op]error)
	}
	if err == nil {
		delete(s.fail, op)
	} else {
		s.fail[op] = err
	}
}

// Delay makes every call of op wait d (or until its context ends) before it
// is carried out; 0 removes the delay.
func (s *Store) Delay(op Op, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	setDuration(&s.delay, op, d)
}

// setDuration sets (*m)[op] to d, or removes it when d <= 0.
func setDuration(m *map[Op]time.Duration, op Op, d time.Duration) {
	if *m == nil {
		*m = make(map[Op]time.Duration)
	}
	if d <= 0 {
		delete(*m, op)
	} else {
		(*m)[op] = d
	}
}

// LateWrites makes every write of op (OpCheckpoint: checkpoint writes;
// OpShardState: shard state writes) of this client fail at once as
// unavailable and yet be carried out d later (fenced and conditional then,
// like any write), unless the cluster is closed by then: an etcd request
// whose client gave up (a timeout) and that the server applied later,
// possibly after newer writes. 0 removes the fault.
func (s *Store) LateWrites(op Op, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	setDuration(&s.late, op, d)
}

// lateWrite carries out apply in a transaction of its own later, and
// returns the call's error, when writes of op are late (LateWrites);
// otherwise it returns nil and does nothing.
func (s *Store) lateWrite(op Op, apply func(c *Cluster, tx *txn)) error {
	s.mu.Lock()
	d := s.late[op]
	s.mu.Unlock()
	if d == 0 {
		return nil
	}
	go func() {
		time.Sleep(d)
		c := s.c
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.closed {
			return
		}
		tx := c.begin()
		apply(c, tx)
		tx.commit()
	}()
	return fmt.Errorf("memory %s: %s: %w (carried out %v later)", s.name, op, storage.ErrUnavailable, d)
}

// Calls returns how many calls of op this client has started.
func (s *Store) Calls(op Op) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[op]
}

// CallCounts returns how many calls of each op this client has started.
func (s *Store) CallCounts() map[Op]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.calls)
}

// Delivered returns how many events this client's watches delivered, by
// what they watch: a keyspace as "name/" (runners/, notices/r1/...), a
// key as itself. A measure of what a runner hears.
func (s *Store) Delivered() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.delivered)
}

// admit applies the faults for op, bounded by the default timeout like the
// etcd store's calls.
func (s *Store) admit(ctx context.Context, op Op) error {
	ctx, cancel := storage.WithOpTimeout(ctx, s.opTimeout)
	defer cancel()
	return s.faults(ctx, op)
}

// enter admits op (see admit) and locks the cluster for it: the caller
// unlocks c.mu.
func (s *Store) enter(ctx context.Context, op Op) (*Cluster, error) {
	if err := s.admit(ctx, op); err != nil {
		return nil, err
	}
	s.c.mu.Lock()
	return s.c, nil
}

func (s *Store) faults(ctx context.Context, op Op) error {
	s.mu.Lock()
	if s.calls == nil {
		s.calls = make(map[Op]int)
	}
	s.calls[op]++
	d := s.delay[op]
	s.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return s.ctxErr(ctx, op)
		case <-t.C:
		}
	}
	s.mu.Lock()
	healed, partitioned := s.healed, s.partitioned
	failErr := s.fail[op]
	s.mu.Unlock()
	if partitioned {
		select {
		case <-ctx.Done():
			return s.ctxErr(ctx, op)
		case <-healed:
		}
	}
	if failErr != nil {
		return fmt.Errorf("memory %s: %s: %w", s.name, op, failErr)
	}
	if err := ctx.Err(); err != nil {
		return s.ctxErr(ctx, op)
	}
	s.c.mu.Lock()
	closed := s.c.closed
	s.c.mu.Unlock()
	if closed {
		return storage.ErrClosed
	}
	return nil
}

func (s *Store) ctxErr(ctx context.Context, op Op) error {
	return fmt.Errorf("memory %s: %s: %w: %w", s.name, op, storage.ErrUnavailable, context.Cause(ctx))
}

// DisableFencing breaks the store on purpose (on) or repairs it (off):
// while it is broken, checkpoint writes and deletes of every client
// succeed whatever their epoch, as a store without fencing would let a
// former owner overwrite a newer owner's state. It exists for tests that
// prove a checker catches what fencing prevents; nothing else should call
// it.
func (c *Cluster) DisableFencing(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unfenced = on
}
