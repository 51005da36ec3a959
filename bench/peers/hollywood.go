package main

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anthdm/hollywood/actor"
	"github.com/anthdm/hollywood/remote"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// hwCounter is the hollywood actor of every scenario.
type hwCounter struct{ counter }

func (c *hwCounter) Receive(ctx *actor.Context) {
	if r := c.receive(ctx.Message()); r != nil {
		ctx.Respond(r)
	}
}

const askTimeout = 10 * time.Second

type hwLocal struct {
	e       *actor.Engine
	mu      sync.Mutex
	pids    []*actor.PID
	tells   int
	tally   atomic.Int64
	spawned int
}

func newHollywoodLocal() (local, error) {
	e, err := actor.NewEngine(actor.NewEngineConfig())
	if err != nil {
		return nil, err
	}
	return &hwLocal{e: e}, nil
}

func (h *hwLocal) spawn(kind, id string, tally *atomic.Int64) *actor.PID {
	pid := h.e.Spawn(func() actor.Receiver { return &hwCounter{counter{tally: tally}} }, kind, actor.WithID(id))
	h.mu.Lock()
	h.pids = append(h.pids, pid)
	h.mu.Unlock()
	return pid
}

func hwAsk(e *actor.Engine, pid *actor.PID, by uint64) (int64, error) {
	v, err := e.Request(pid, wrapperspb.UInt64(by), askTimeout).Result()
	if err != nil {
		return 0, err
	}
	r, ok := v.(*wrapperspb.Int64Value)
	if !ok {
		return 0, fmt.Errorf("hollywood answered %T", v)
	}
	return r.Value, nil
}

func (h *hwLocal) Tell(n int) error {
	h.tells++
	pid := h.spawn("tell", strconv.Itoa(h.tells), nil)
	for range n {
		h.e.Send(pid, wrapperspb.Int64(1))
	}
	return waitCount(func() (int64, error) { return hwAsk(h.e, pid, 0) }, int64(n), time.Minute)
}

func (h *hwLocal) Ask(id int, loop func(ask func() error) error) error {
	pid := h.spawn("ask", strconv.Itoa(id), nil)
	return checkedLoop(loop, func() (int64, error) { return hwAsk(h.e, pid, 1) })
}

func (h *hwLocal) Activate(n int) error {
	h.tally.Store(0)
	base := h.spawned
	h.spawned += n
	for i := range n {
		h.e.Send(h.spawn("idle", strconv.Itoa(base+i), &h.tally), wrapperspb.Int64(1))
	}
	return waitCount(func() (int64, error) { return h.tally.Load(), nil }, int64(n), time.Minute)
}

// Close stops every actor it spawned (hollywood's engine has no stop of
// its own).
func (h *hwLocal) Close() { hwPoison(h.e, h.pids) }

func hwPoison(e *actor.Engine, pids []*actor.PID) {
	for _, pid := range pids {
		<-e.Poison(pid).Done()
	}
}

// hwRemote is two engines with hollywood's remote (DRPC streams over
// loopback TCP): actors live on the server, asks come from the client.
type hwRemote struct {
	server, client   *actor.Engine
	rServer, rClient *remote.Remote
	mu               sync.Mutex
	pids             []*actor.PID
}

func newHollywoodRemote() (remoteNodes, error) {
	var engines [2]*actor.Engine
	var remotes [2]*remote.Remote
	for i := range engines {
		addr, err := freeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		remotes[i] = remote.New(addr, remote.NewConfig())
		engines[i], err = actor.NewEngine(actor.NewEngineConfig().WithRemote(remotes[i]))
		if err != nil {
			for _, r := range remotes[:i] {
				r.Stop().Wait()
			}
			return nil, err
		}
	}
	return &hwRemote{server: engines[0], client: engines[1], rServer: remotes[0], rClient: remotes[1]}, nil
}

func (h *hwRemote) Ask(id int, loop func(ask func() error) error) error {
	local := h.server.Spawn(func() actor.Receiver { return &hwCounter{} }, "counter", actor.WithID(strconv.Itoa(id)))
	h.mu.Lock()
	h.pids = append(h.pids, local)
	h.mu.Unlock()
	pid := actor.NewPID(h.rServer.Address(), local.ID) // as the client addresses it
	return checkedLoop(loop, func() (int64, error) { return hwAsk(h.client, pid, 1) })
}

func (h *hwRemote) Close() {
	hwPoison(h.server, h.pids)
	h.rClient.Stop().Wait()
	h.rServer.Stop().Wait()
}
