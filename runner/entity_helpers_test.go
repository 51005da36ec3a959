package runner_test

import (
	"context"
	"encoding/binary"
	"sync"
	"testing"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

// The hosting tests' fixtures: a counter entity with every hook, its
// kind, and a runner that hosts it.

// hookLog records lifecycle hook calls of test entities.
type hookLog struct {
	mu   sync.Mutex
	acts []entity.ActivateInfo
	rels []entity.ReleaseInfo
}

func (l *hookLog) activations() []entity.ActivateInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]entity.ActivateInfo(nil), l.acts...)
}

func (l *hookLog) releases() []entity.ReleaseInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]entity.ReleaseInfo(nil), l.rels...)
}

type testEntity struct {
	id         string
	log        *hookLog
	n          int64
	checkpoint bool // save n in Release, restore it in Activate
}

// blockReq carries channels: local calls only (tagged so the codec check
// accepts it; they would arrive nil on another runner).
type blockReq struct {
	Started chan<- struct{} `json:"-"`
	Release <-chan struct{} `json:"-"`
}

func (e *testEntity) Inc(_ context.Context, r incReq) (int64, error) { e.n += r.By; return e.n, nil }
func (e *testEntity) Add(_ context.Context, r incReq) error          { e.n += r.By; return nil }
func (e *testEntity) Panic(_ context.Context, _ incReq) (int64, error) {
	panic("boom")
}

// Block runs until released or until its context ends (then returns the cause).
func (e *testEntity) Block(ctx context.Context, r blockReq) (string, error) {
	if r.Started != nil {
		r.Started <- struct{}{}
	}
	select {
	case <-r.Release:
		return "released", nil
	case <-ctx.Done():
		return "", context.Cause(ctx)
	}
}

func (e *testEntity) Activate(ctx context.Context, info entity.ActivateInfo) error {
	e.log.mu.Lock()
	e.log.acts = append(e.log.acts, info)
	e.log.mu.Unlock()
	if e.checkpoint && info.Restore != nil {
		b, ok, err := info.Restore(ctx)
		if err != nil {
			return err
		}
		if ok {
			e.n = int64(binary.BigEndian.Uint64(b))
		}
	}
	return nil
}

func (e *testEntity) Release(ctx context.Context, info entity.ReleaseInfo) error {
	e.log.mu.Lock()
	e.log.rels = append(e.log.rels, info)
	e.log.mu.Unlock()
	if e.checkpoint && info.Checkpoint != nil {
		return info.Checkpoint(ctx, binary.BigEndian.AppendUint64(nil, uint64(e.n)))
	}
	return nil
}

type testKind struct {
	kind  *entity.Kind[testEntity]
	inc   *entity.MethodRef[testEntity, incReq, int64]
	add   *entity.SignalRef[testEntity, incReq]
	panic *entity.MethodRef[testEntity, incReq, int64]
	block *entity.MethodRef[testEntity, blockReq, string]
	log   *hookLog
}

func newTestKind(checkpoint bool, opts ...entity.Option) *testKind {
	log := &hookLog{}
	k := entity.NewKind("test", func(id string) *testEntity { return &testEntity{id: id, log: log, checkpoint: checkpoint} }, opts...)
	return &testKind{
		kind:  k,
		inc:   entity.Method(k, "inc", (*testEntity).Inc),
		add:   entity.Signal(k, "add", (*testEntity).Add),
		panic: entity.Method(k, "panic", (*testEntity).Panic),
		block: entity.Method(k, "block", (*testEntity).Block),
		log:   log,
	}
}

// startHosting starts a runner owning all shards of a fresh memory cluster
// with kind registered.
func startHosting(t *testing.T, k *testKind, cfg runner.Config) (*memory.Cluster, *started, *recorder) {
	t.Helper()
	if cfg.ID == "" {
		cfg.ID = "a"
	}
	if cfg.NumShards == 0 {
		cfg.NumShards = 8
	}
	return startOwningAll(t, cfg, k.kind)
}
