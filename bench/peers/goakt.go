package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tochemey/goakt/v3/actor"
	"github.com/tochemey/goakt/v3/address"
	"github.com/tochemey/goakt/v3/log"
	goaktremote "github.com/tochemey/goakt/v3/remote"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// gaCounter is the goakt actor of every scenario.
type gaCounter struct{ counter }

func (c *gaCounter) PreStart(*actor.Context) error { return nil }
func (c *gaCounter) PostStop(*actor.Context) error { return nil }
func (c *gaCounter) Receive(ctx *actor.ReceiveContext) {
	if r := c.receive(ctx.Message()); r != nil {
		ctx.Response(r)
	}
}

func gaAnswer(v proto.Message, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	r, ok := v.(*wrapperspb.Int64Value)
	if !ok {
		return 0, fmt.Errorf("goakt answered %T", v)
	}
	return r.Value, nil
}

func gaStart(opts ...actor.Option) (actor.ActorSystem, error) {
	sys, err := actor.NewActorSystem("peers", append([]actor.Option{actor.WithLogger(log.DiscardLogger)}, opts...)...)
	if err != nil {
		return nil, err
	}
	if err := sys.Start(context.Background()); err != nil {
		return nil, err
	}
	return sys, nil
}

type gaLocal struct {
	sys     actor.ActorSystem
	tells   int
	spawned int
	tally   atomic.Int64
}

func newGoaktLocal() (local, error) {
	sys, err := gaStart()
	if err != nil {
		return nil, err
	}
	return &gaLocal{sys: sys}, nil
}

func (g *gaLocal) ask(pid *actor.PID, by uint64) (int64, error) {
	return gaAnswer(actor.Ask(context.Background(), pid, wrapperspb.UInt64(by), askTimeout))
}

func (g *gaLocal) Tell(n int) error {
	ctx := context.Background()
	g.tells++
	pid, err := g.sys.Spawn(ctx, "tell-"+strconv.Itoa(g.tells), &gaCounter{})
	if err != nil {
		return err
	}
	for range n {
		if err := actor.Tell(ctx, pid, wrapperspb.Int64(1)); err != nil {
			return err
		}
	}
	return waitCount(func() (int64, error) { return g.ask(pid, 0) }, int64(n), time.Minute)
}

func (g *gaLocal) Ask(id int, loop func(ask func() error) error) error {
	pid, err := g.sys.Spawn(context.Background(), "ask-"+strconv.Itoa(id), &gaCounter{})
	if err != nil {
		return err
	}
	return checkedLoop(loop, func() (int64, error) { return g.ask(pid, 1) })
}

func (g *gaLocal) Activate(n int) error {
	ctx := context.Background()
	g.tally.Store(0)
	base := g.spawned
	g.spawned += n
	for i := range n {
		pid, err := g.sys.Spawn(ctx, "idle-"+strconv.Itoa(base+i), &gaCounter{counter{tally: &g.tally}})
		if err != nil {
			return err
		}
		if err := actor.Tell(ctx, pid, wrapperspb.Int64(1)); err != nil {
			return err
		}
	}
	return waitCount(func() (int64, error) { return g.tally.Load(), nil }, int64(n), time.Minute)
}

func (g *gaLocal) Close() { _ = g.sys.Stop(context.Background()) }

// gaRemote is goakt's remoting: a system serving on loopback and a
// Remoting client that asks its actors (connect/HTTP-2 over TCP).
type gaRemote struct {
	server actor.ActorSystem
	client *actor.Remoting
	host   string
	port   int
}

func newGoaktRemote() (remoteNodes, error) {
	addr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	host, portText, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portText)
	sys, err := gaStart(actor.WithRemote(goaktremote.NewConfig(host, port)))
	if err != nil {
		return nil, err
	}
	return &gaRemote{server: sys, client: actor.NewRemoting(), host: host, port: port}, nil
}

func (g *gaRemote) Ask(id int, loop func(ask func() error) error) error {
	ctx := context.Background()
	name := "counter-" + strconv.Itoa(id)
	if _, err := g.server.Spawn(ctx, name, &gaCounter{}); err != nil {
		return err
	}
	to, err := g.client.RemoteLookup(ctx, g.host, g.port, name)
	if err != nil {
		return err
	}
	var c counterCheck
	return loop(func() error {
		rsp, err := g.client.RemoteAsk(ctx, address.NoSender(), to, wrapperspb.UInt64(1), askTimeout)
		if err != nil {
			return err
		}
		var v wrapperspb.Int64Value
		if err := rsp.UnmarshalTo(&v); err != nil {
			return err
		}
		return c.check(v.Value)
	})
}

func (g *gaRemote) Close() {
	g.client.Close()
	_ = g.server.Stop(context.Background())
}
