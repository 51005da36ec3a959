package runnerproc

import (
	"context"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
)

// Spec says what a child runs.
type Spec struct {
	// Endpoints of the etcd cluster (host:port).
	Endpoints []string `json:"endpoints"`
	// Namespace of the store.
	Namespace string `json:"namespace"`
	// Config of the runner; ListenAddr defaults to "127.0.0.1:0".
	Config Config `json:"config"`
	// WatchDeletes: report the DELETE events of the namespace's runners/
	// and shards/ keys as the child's own watch delivers them (one event
	// per key prefix and revision).
	WatchDeletes bool `json:"watchDeletes,omitempty"`
	// LogLevel of the child's log on standard error: "debug", "info",
	// "warn" (default) or "error".
	LogLevel string `json:"logLevel,omitempty"`
	// StatusPoll is how often the child reads its runner's status to report
	// lease deadlines and assignment changes. Default 5 ms.
	StatusPoll time.Duration `json:"statusPoll,omitempty"`
	// History is a file the child appends its history to (Record lines:
	// every Counter handler's start and end, checkpoint writes,
	// activations, releases, the runs of its singletons and shard worker,
	// the lives of its keepers, and the runner's ownership, detach and
	// registration events); "" records nothing.
	History string `json:"history,omitempty"`
	// CheckpointEvery: a Counter checkpoints (fenced) after this many
	// increments, and in its Release hook; 0 only in Release.
	CheckpointEvery int `json:"checkpointEvery,omitempty"`
	// Singletons: run this many singletons (SingletonName(0..n-1)),
	// whose bodies record their runs in History (always.go).
	Singletons int `json:"singletons,omitempty"`
	// ShardWorker: run the shard worker ShardWorkerName, recording its
	// runs in History.
	ShardWorker bool `json:"shardWorker,omitempty"`
}

// Config is the part of runner.Config a child accepts. Zero fields mean
// the runner's defaults.
type Config struct {
	ID                     string        `json:"id"`
	ListenAddr             string        `json:"listenAddr,omitempty"`
	NumShards              int           `json:"numShards,omitempty"`
	Weight                 int           `json:"weight,omitempty"`
	StartTimeout           time.Duration `json:"startTimeout,omitempty"`
	LeaseTTL               time.Duration `json:"leaseTTL,omitempty"`
	LeaseRenewInterval     time.Duration `json:"leaseRenewInterval,omitempty"`
	DetachMargin           time.Duration `json:"detachMargin,omitempty"`
	RecoverWindow          time.Duration `json:"recoverWindow,omitempty"`
	RebalanceDebounce      time.Duration `json:"rebalanceDebounce,omitempty"`
	AcquireRetryInterval   time.Duration `json:"acquireRetryInterval,omitempty"`
	AcquireRetryWindow     time.Duration `json:"acquireRetryWindow,omitempty"`
	OpTimeout              time.Duration `json:"opTimeout,omitempty"`
	DrainTimeout           time.Duration `json:"drainTimeout,omitempty"`
	ShutdownHandoffTimeout time.Duration `json:"shutdownHandoffTimeout,omitempty"`
	DisableHandoff         bool          `json:"disableHandoff,omitempty"`
}

func (c Config) runnerConfig() runner.Config {
	listen := c.ListenAddr
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	return runner.Config{
		ID: c.ID, ListenAddr: listen, NumShards: c.NumShards, Weight: c.Weight, StartTimeout: c.StartTimeout,
		LeaseTTL: c.LeaseTTL, LeaseRenewInterval: c.LeaseRenewInterval, DetachMargin: c.DetachMargin,
		RecoverWindow: c.RecoverWindow, RebalanceDebounce: c.RebalanceDebounce,
		AcquireRetryInterval: c.AcquireRetryInterval, AcquireRetryWindow: c.AcquireRetryWindow,
		OpTimeout: c.OpTimeout, DrainTimeout: c.DrainTimeout, ShutdownHandoffTimeout: c.ShutdownHandoffTimeout,
		DisableHandoff: c.DisableHandoff,
	}
}

// Event kinds.
const (
	KindRegistered   = "registered"   // Lease; Address: where the runner serves
	KindAcquired     = "acquired"     // Shard, Epoch
	KindReleased     = "released"     // Shard, Epoch
	KindLost         = "lost"         // Shard, Epoch, Detail (the cause)
	KindDetached     = "detached"     // Detail: reason and detail; Deadline
	KindReattached   = "reattached"   // Lease; Detail "new lease" or ""
	KindHandoff      = "handoff"      // Shard, Detail: phase from -> to
	KindDeadline     = "deadline"     // Deadline: the lease deadline after a renewal
	KindWatchDelete  = "watch-delete" // Key (prefix: "runners/" or "shards/"), Revision, Count, Detail: the deleted runner IDs
	KindShutdownDone = "shutdown"     // Detail: the Shutdown error, if any
	KindAssignment   = "assignment"   // Detail: the assignment's digest (hex); Count: shards owned
)

// Event is one line of a child's output.
type Event struct {
	Kind     string    `json:"kind"`
	Time     time.Time `json:"time"` // the child's wall clock
	Runner   string    `json:"runner"`
	Shard    int       `json:"shard,omitempty"`
	Epoch    int64     `json:"epoch,omitempty"`
	Lease    int64     `json:"lease,omitempty"`
	Address  string    `json:"address,omitempty"`
	Deadline time.Time `json:"deadline,omitzero"`
	Key      string    `json:"key,omitempty"`
	Revision int64     `json:"revision,omitempty"`
	Count    int       `json:"count,omitempty"`
	Detail   string    `json:"detail,omitempty"`
}

// EchoReq asks an entity of Kind to answer; Sleep delays the answer.
type EchoReq struct {
	Sleep time.Duration `json:"sleep,omitempty"`
}

// EchoResp says where an Echo ran.
type EchoResp struct {
	Runner string `json:"runner"`
	Shard  int    `json:"shard"`
	Epoch  int64  `json:"epoch"`
	N      int64  `json:"n"` // calls this entity instance served
}

type echo struct{ n int64 }

func (e *echo) Echo(ctx context.Context, r EchoReq) (EchoResp, error) {
	if r.Sleep > 0 {
		t := time.NewTimer(r.Sleep)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return EchoResp{}, context.Cause(ctx)
		}
	}
	e.n++
	info, _ := runner.ShardInfoFrom(ctx)
	return EchoResp{Runner: info.Runner, Shard: int(info.Shard), Epoch: int64(info.Epoch), N: e.n}, nil
}

// Kind is the entity kind every child hosts; a gateway in the parent
// registers it too (client-only runners need the kind to route it).
var Kind = entity.NewKind("runnerproc-echo", func(string) *echo { return &echo{} })

// Echo is Kind's only method.
var Echo = entity.Method(Kind, "echo", (*echo).Echo)
