package main

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"ergo.services/ergo"
	"ergo.services/ergo/act"
	"ergo.services/ergo/gen"
	"ergo.services/ergo/net/edf"
)

// Ergo's messages: plain structs, registered for its network format.
type eaTell struct{ By int64 }
type eaAsk struct{ By int64 }

func init() {
	for _, v := range []any{eaTell{}, eaAsk{}} {
		if err := edf.RegisterTypeOf(v); err != nil {
			panic(err)
		}
	}
}

// eaCounter is the ergo actor of every scenario.
type eaCounter struct {
	act.Actor
	n     int64
	tally *atomic.Int64
}

func (c *eaCounter) Init(args ...any) error {
	if len(args) == 1 {
		c.tally, _ = args[0].(*atomic.Int64)
	}
	return nil
}

func (c *eaCounter) HandleMessage(_ gen.PID, message any) error {
	if m, ok := message.(eaTell); ok {
		c.n += m.By
		if c.tally != nil {
			c.tally.Add(1)
		}
	}
	return nil
}

func (c *eaCounter) HandleCall(_ gen.PID, _ gen.Ref, request any) (any, error) {
	m, ok := request.(eaAsk)
	if !ok {
		return nil, fmt.Errorf("ergo counter: unexpected request %T", request)
	}
	c.n += m.By
	return c.n, nil
}

// eaRun asks an ergo caller process to run loop with target: ergo's
// requests (Call) are made by a process, not from outside the node.
type eaRun struct {
	target any // gen.PID or gen.ProcessID
	loop   func(ask func(by int64) (int64, error)) error
	done   chan error
}

// eaCaller runs one eaRun at a time in its own process.
type eaCaller struct{ act.Actor }

func (c *eaCaller) HandleMessage(_ gen.PID, message any) error {
	m, ok := message.(eaRun)
	if !ok {
		return nil
	}
	m.done <- m.loop(func(by int64) (int64, error) {
		v, err := c.Call(m.target, eaAsk{By: by})
		if err != nil {
			return 0, err
		}
		n, ok := v.(int64)
		if !ok {
			return 0, fmt.Errorf("ergo answered %T", v)
		}
		return n, nil
	})
	return nil
}

func eaNode(name string, network bool) (gen.Node, error) {
	opts := gen.NodeOptions{Log: gen.LogOptions{Level: gen.LogLevelDisabled}}
	if !network {
		opts.Network.Mode = gen.NetworkModeDisabled
	} else {
		opts.Network.Cookie = "peers"
	}
	return ergo.StartNode(gen.Atom(name), opts)
}

// eaCall runs loop in a new caller process on node that asks target.
func eaCall(node gen.Node, target any, loop func(ask func(by int64) (int64, error)) error) error {
	caller, err := node.Spawn(func() gen.ProcessBehavior { return &eaCaller{} }, gen.ProcessOptions{})
	if err != nil {
		return err
	}
	defer node.Kill(caller)
	done := make(chan error, 1)
	if err := node.Send(caller, eaRun{target: target, loop: loop, done: done}); err != nil {
		return err
	}
	return <-done
}

func eaCounterFactory() gen.ProcessBehavior { return &eaCounter{} }

type eaLocal struct {
	node  gen.Node
	tally atomic.Int64
}

func newErgoLocal() (local, error) {
	node, err := eaNode("peers-local@localhost", false)
	if err != nil {
		return nil, err
	}
	return &eaLocal{node: node}, nil
}

func (e *eaLocal) Tell(n int) error {
	pid, err := e.node.Spawn(eaCounterFactory, gen.ProcessOptions{})
	if err != nil {
		return err
	}
	for range n {
		if err := e.node.Send(pid, eaTell{By: 1}); err != nil {
			return err
		}
	}
	return eaCall(e.node, pid, func(ask func(int64) (int64, error)) error {
		return waitCount(func() (int64, error) { return ask(0) }, int64(n), time.Minute)
	})
}

func (e *eaLocal) Ask(_ int, loop func(ask func() error) error) error {
	pid, err := e.node.Spawn(eaCounterFactory, gen.ProcessOptions{})
	if err != nil {
		return err
	}
	return eaCall(e.node, pid, eaChecked(loop))
}

// eaChecked adapts loop to an ask by one whose answers are checked.
func eaChecked(loop func(ask func() error) error) func(ask func(by int64) (int64, error)) error {
	return func(ask func(by int64) (int64, error)) error {
		return checkedLoop(loop, func() (int64, error) { return ask(1) })
	}
}

func (e *eaLocal) Activate(n int) error {
	e.tally.Store(0)
	for range n {
		pid, err := e.node.Spawn(eaCounterFactory, gen.ProcessOptions{}, &e.tally)
		if err != nil {
			return err
		}
		if err := e.node.Send(pid, eaTell{By: 1}); err != nil {
			return err
		}
	}
	return waitCount(func() (int64, error) { return e.tally.Load(), nil }, int64(n), time.Minute)
}

func (e *eaLocal) Close() { e.node.Stop() }

// eaRemote is two ergo nodes connected by ergo's own network protocol
// over loopback TCP (its built-in registrar on localhost): callers on one
// node ask actors registered by name on the other.
type eaRemote struct {
	server, client gen.Node
}

var eaRemoteRuns atomic.Int64

func newErgoRemote() (remoteNodes, error) {
	run := strconv.FormatInt(eaRemoteRuns.Add(1), 10)
	server, err := eaNode("peers-server-"+run+"@localhost", true)
	if err != nil {
		return nil, err
	}
	client, err := eaNode("peers-client-"+run+"@localhost", true)
	if err != nil {
		server.Stop()
		return nil, err
	}
	return &eaRemote{server: server, client: client}, nil
}

func (e *eaRemote) Ask(id int, loop func(ask func() error) error) error {
	name := gen.Atom("counter-" + strconv.Itoa(id))
	if _, err := e.server.SpawnRegister(name, eaCounterFactory, gen.ProcessOptions{}); err != nil {
		return err
	}
	return eaCall(e.client, gen.ProcessID{Name: name, Node: e.server.Name()}, eaChecked(loop))
}

func (e *eaRemote) Close() {
	e.client.Stop()
	e.server.Stop()
}
