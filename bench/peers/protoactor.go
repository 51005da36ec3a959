package main

import (
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// paCounter is the protoactor actor of every scenario.
type paCounter struct{ counter }

func (c *paCounter) Receive(ctx actor.Context) {
	if r := c.receive(ctx.Message()); r != nil {
		ctx.Respond(r)
	}
}

func paSystem() *actor.ActorSystem {
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quietLog }))
}

type paLocal struct {
	sys   *actor.ActorSystem
	tally atomic.Int64
}

func newProtoactorLocal() (local, error) { return &paLocal{sys: paSystem()}, nil }

func (p *paLocal) spawn(tally *atomic.Int64) *actor.PID {
	return p.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &paCounter{counter{tally: tally}} }))
}

func paAnswer(v any, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	r, ok := v.(*wrapperspb.Int64Value)
	if !ok {
		return 0, fmt.Errorf("protoactor answered %T", v)
	}
	return r.Value, nil
}

func (p *paLocal) ask(pid *actor.PID, by uint64) (int64, error) {
	return paAnswer(p.sys.Root.RequestFuture(pid, wrapperspb.UInt64(by), askTimeout).Result())
}

func (p *paLocal) Tell(n int) error {
	pid := p.spawn(nil)
	for range n {
		p.sys.Root.Send(pid, wrapperspb.Int64(1))
	}
	return waitCount(func() (int64, error) { return p.ask(pid, 0) }, int64(n), time.Minute)
}

func (p *paLocal) Ask(_ int, loop func(ask func() error) error) error {
	pid := p.spawn(nil)
	return checkedLoop(loop, func() (int64, error) { return p.ask(pid, 1) })
}

func (p *paLocal) Activate(n int) error {
	p.tally.Store(0)
	for range n {
		p.sys.Root.Send(p.spawn(&p.tally), wrapperspb.Int64(1))
	}
	return waitCount(func() (int64, error) { return p.tally.Load(), nil }, int64(n), time.Minute)
}

func (p *paLocal) Close() { p.sys.Shutdown() }

// paCluster is protoactor's cluster mode: one member hosting the
// "counter" kind (virtual actors placed by the disthash identity lookup)
// and one member without kinds that asks, both on gRPC remotes over loopback; membership comes
// from protoactor's in-memory test provider (no consul/etcd needed).
type paCluster struct {
	member, client *cluster.Cluster
}

func newProtoactorCluster() (remoteNodes, error) {
	agent := test.NewInMemAgent()
	kind := cluster.NewKind("counter", actor.PropsFromProducer(func() actor.Actor { return &paCounter{} }))
	member := cluster.New(paSystem(), cluster.Configure("peers", test.NewTestProvider(agent), disthash.New(),
		remote.Configure("127.0.0.1", 0), cluster.WithKinds(kind)))
	member.StartMember()
	client := cluster.New(paSystem(), cluster.Configure("peers", test.NewTestProvider(agent), disthash.New(),
		remote.Configure("127.0.0.1", 0)))
	// The client joins as a member without kinds (so it hosts no counter):
	// this version's test provider fails a client (StartClient dereferences
	// the cluster it only sets for members).
	client.StartMember()
	p := &paCluster{member: member, client: client}
	deadline := time.Now().Add(10 * time.Second)
	for { // until the client knows the member
		_, err := paAnswer(client.Request("warm", "counter", wrapperspb.UInt64(0)))
		if err == nil {
			return p, nil
		}
		if time.Now().After(deadline) {
			p.Close()
			return nil, fmt.Errorf("protoactor client does not reach the member: %w", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *paCluster) Ask(id int, loop func(ask func() error) error) error {
	identity := "c" + strconv.Itoa(id)
	return checkedLoop(loop, func() (int64, error) { return paAnswer(p.client.Request(identity, "counter", wrapperspb.UInt64(1))) })
}

func (p *paCluster) Close() {
	p.client.Shutdown(true)
	p.member.Shutdown(true)
}
