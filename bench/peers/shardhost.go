package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/entity/protocodec"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

// shCounter is the shardhost entity of every scenario: a count, and for
// the activation scenario a shared tally of first messages.
type shCounter struct {
	n     int64
	tally *atomic.Int64
}

type shInc struct{ By int64 }

func (c *shCounter) Inc(_ context.Context, r shInc) (int64, error) { c.n += r.By; return c.n, nil }

// IncProto is Inc with protocol buffer messages (shProtoKind).
func (c *shCounter) IncProto(_ context.Context, r *wrapperspb.Int64Value) (*wrapperspb.Int64Value, error) {
	c.n += r.GetValue()
	return wrapperspb.Int64(c.n), nil
}
func (c *shCounter) Add(_ context.Context, r shInc) error {
	c.n += r.By
	if c.tally != nil {
		c.tally.Add(1)
	}
	return nil
}

// shActivated counts the activation kind's processed messages (one run
// at a time uses it).
var shActivated atomic.Int64

var (
	shKind = entity.NewKind("peers-counter", func(string) *shCounter { return &shCounter{} },
		entity.Mailbox(1<<16), entity.IdleAfter(time.Hour))
	shIncM = entity.Method(shKind, "inc", (*shCounter).Inc)
	shAddS = entity.Signal(shKind, "add", (*shCounter).Add)

	// shIdleKind has the default mailbox: the activation scenario measures
	// what an idle entity costs as a user would declare it.
	shIdleKind = entity.NewKind("peers-idle", func(string) *shCounter { return &shCounter{tally: &shActivated} },
		entity.IdleAfter(time.Hour))
	shIdleAdd = entity.Signal(shIdleKind, "add", (*shCounter).Add)

	// shProtoKind is shKind with the protocol buffer codec
	// (shardhost-proto: remote asks only, local calls never encode).
	shProtoKind = entity.NewKind("peers-counter-proto", func(string) *shCounter { return &shCounter{} },
		entity.Mailbox(1<<16), entity.IdleAfter(time.Hour), entity.WithCodec(protocodec.Codec))
	shProtoIncM = entity.Method(shProtoKind, "inc", (*shCounter).IncProto)
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

type shLocal struct {
	r       *runner.Runner
	cluster *memory.Cluster
	done    chan struct{}
	tells   int  // tell runs so far (each uses a fresh entity)
	viaRef  bool // send through a runner.Ref per entity (shardhost-ref)
}

// startRunner starts a runner on c and waits until it owns every shard
// (owner) or routes to the owner (client-only, waited by the caller).
func startRunner(c *memory.Cluster, cfg runner.Config) (*runner.Runner, chan struct{}, error) {
	cfg.NumShards = 64
	cfg.Logger = quietLog
	r, err := runner.New(c.NewStore(cfg.ID), cfg)
	if err != nil {
		return nil, nil, err
	}
	if err := r.Register(shKind, shIdleKind, shProtoKind); err != nil {
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(context.Background()) }()
	if !cfg.ClientOnly {
		deadline := time.Now().Add(10 * time.Second)
		for len(r.Owned()) != cfg.NumShards {
			if time.Now().After(deadline) {
				r.Close()
				<-done
				return nil, nil, fmt.Errorf("runner %s owns %d of %d shards after 10 s", cfg.ID, len(r.Owned()), cfg.NumShards)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return r, done, nil
}

func newShardhostLocal() (local, error) {
	c := memory.NewCluster()
	r, done, err := startRunner(c, runner.Config{ID: "local"})
	if err != nil {
		c.Close()
		return nil, err
	}
	return &shLocal{r: r, cluster: c, done: done}, nil
}

// newShardhostRefLocal is shardhost's local mode sending through a
// runner.Ref per entity: the like-for-like comparison with the peers,
// which send to a PID obtained once.
func newShardhostRefLocal() (local, error) {
	l, err := newShardhostLocal()
	if err != nil {
		return nil, err
	}
	l.(*shLocal).viaRef = true
	return l, nil
}

// sender returns what sends to entity id: the runner (by ID), or a
// runner.Ref on the entity when the adapter measures the handle.
func (s *shLocal) sender(id string) entity.Sender {
	if s.viaRef {
		return s.r.Ref(shKind, id)
	}
	return s.r
}

func (s *shLocal) Tell(n int) error {
	ctx := context.Background()
	s.tells++
	id := "tell-" + strconv.Itoa(s.tells)
	snd := s.sender(id)
	for range n {
		for {
			err := shAddS.Tell(ctx, snd, id, shInc{By: 1})
			if err == nil {
				break
			}
			if !errors.Is(err, entity.ErrMailboxFull) {
				return err
			}
			runtime.Gosched() // mailbox full: let the entity catch up
		}
	}
	return waitCount(func() (int64, error) {
		got, err := shIncM.Ask(ctx, snd, id, shInc{})
		if errors.Is(err, entity.ErrMailboxFull) {
			return 0, nil // still draining the tells: ask again
		}
		return got, err
	}, int64(n), time.Minute)
}

func (s *shLocal) Ask(id int, loop func(ask func() error) error) error {
	ctx := context.Background()
	key := "ask-" + strconv.Itoa(id)
	snd := s.sender(key)
	return checkedLoop(loop, func() (int64, error) { return shIncM.Ask(ctx, snd, key, shInc{By: 1}) })
}

func (s *shLocal) Activate(n int) error {
	if s.viaRef {
		return skip("a handle serves an entity called often; activations go by ID (the shardhost column)")
	}
	ctx := context.Background()
	shActivated.Store(0)
	for i := range n {
		if err := shIdleAdd.Tell(ctx, s.r, "idle-"+strconv.Itoa(i), shInc{By: 1}); err != nil {
			return err
		}
	}
	return waitCount(func() (int64, error) { return shActivated.Load(), nil }, int64(n), time.Minute)
}

func (s *shLocal) Close() {
	s.r.Close()
	<-s.done
	s.cluster.Close()
}

// shRemote is an owner runner serving on loopback and a client-only runner
// on one memory store: every ask crosses loopback TCP (gRPC).
type shRemote struct {
	owner, client *runner.Runner
	done          []chan struct{}
	cluster       *memory.Cluster
	proto         bool // asks of shProtoKind (shardhost-proto)
}

// newShardhostProtoRemote is shardhost's remote mode with the protocol
// buffer codec, as the peers that send protocol buffers do.
func newShardhostProtoRemote() (remoteNodes, error) {
	r, err := newShardhostRemote()
	if err != nil {
		return nil, err
	}
	r.(*shRemote).proto = true
	return r, nil
}

func newShardhostRemote() (remoteNodes, error) {
	c := memory.NewCluster()
	owner, d1, err := startRunner(c, runner.Config{ID: "owner", ListenAddr: "127.0.0.1:0"})
	if err != nil {
		c.Close()
		return nil, err
	}
	client, d2, err := startRunner(c, runner.Config{ID: "client", ClientOnly: true})
	if err != nil {
		owner.Close()
		<-d1
		c.Close()
		return nil, err
	}
	s := &shRemote{owner: owner, client: client, done: []chan struct{}{d1, d2}, cluster: c}
	deadline := time.Now().Add(10 * time.Second)
	for { // until the client routes to the owner
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := shIncM.Ask(cctx, client, "warm", shInc{})
		cancel()
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Close()
			return nil, fmt.Errorf("client does not reach the owner: %w", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *shRemote) Ask(id int, loop func(ask func() error) error) error {
	ctx := context.Background()
	key := "remote-" + strconv.Itoa(id)
	if s.proto {
		one := wrapperspb.Int64(1) // read-only: the owner decodes its own
		return checkedLoop(loop, func() (int64, error) {
			got, err := shProtoIncM.Ask(ctx, s.client, key, one)
			return got.GetValue(), err
		})
	}
	return checkedLoop(loop, func() (int64, error) { return shIncM.Ask(ctx, s.client, key, shInc{By: 1}) })
}

func (s *shRemote) Close() {
	s.client.Close()
	s.owner.Close()
	for _, d := range s.done {
		<-d
	}
	s.cluster.Close()
}
