package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/rpc"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/sharding"
)

// The load child: the gateway, the callers and the crash probes in a
// process of their own (this program, re-executed), so that the kernel
// counts their CPU apart from the hosting runners'. Without it the 32
// callers take whatever CPU the runners leave, and a step's CPU says as
// much about the callers as about the change. The parent drives the child
// with net/rpc over the child's standard input and output; the child's
// log goes to the parent's progress writer. It dies with the parent
// (testenv.ChildSysProcAttr) and exits when its standard input closes.

// envLoad carries the JSON-encoded loadSpec to the load child.
const envLoad = "SHARDHOST_CHURN_LOAD"

// loadChildMain runs the load child and exits when this process was
// started as one; otherwise it returns at once. Call it first in main and
// TestMain.
func loadChildMain() {
	s, ok := os.LookupEnv(envLoad)
	if !ok {
		return
	}
	var spec loadSpec
	if err := json.Unmarshal([]byte(s), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "churn load: bad %s: %v\n", envLoad, err)
		os.Exit(2)
	}
	level := slog.LevelError
	if spec.Verbose {
		level = slog.LevelInfo
	}
	g, err := newGatewayLoad(spec, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
	if err != nil {
		fmt.Fprintf(os.Stderr, "churn load: %v\n", err)
		os.Exit(1)
	}
	srv := rpc.NewServer()
	if err := srv.RegisterName("Load", &loadService{g: g}); err != nil {
		fmt.Fprintf(os.Stderr, "churn load: %v\n", err)
		os.Exit(1)
	}
	srv.ServeConn(stdio{os.Stdin, os.Stdout}) // until the parent closes our input
	g.close()
	os.Exit(0)
}

// stdio is a connection made of a reader and a writer.
type stdio struct {
	io.Reader
	io.Writer
}

func (stdio) Close() error { return nil }

// Wire forms of the load's arguments and results (net/rpc takes exported
// types, and gob encodes exported fields only).
type (
	LoadAsks struct {
		At, Dur []time.Duration
		Class   []int8
		Samples map[string]string
	}
	LoadProbe struct {
		Owned   []sharding.ShardID
		Victim  string
		CrashAt time.Time
	}
	LoadFirstAsk struct {
		Shard                     sharding.ShardID
		CrashAt, Answered, Routed time.Time
	}
)

// loadService is the child's side: a gatewayLoad behind net/rpc.
type loadService struct{ g *gatewayLoad }

func (s *loadService) Ready(_ struct{}, _ *struct{}) error { return nil }

func (s *loadService) Begin(_ struct{}, began *time.Time) error {
	var err error
	*began, err = s.g.begin()
	return err
}

func (s *loadService) Finish(_ struct{}, out *LoadAsks) error {
	asks, samples, err := s.g.finish()
	out.At, out.Dur, out.Class = make([]time.Duration, len(asks)), make([]time.Duration, len(asks)), make([]int8, len(asks))
	for i, a := range asks {
		out.At[i], out.Dur[i], out.Class[i] = a.at, a.dur, a.class
	}
	out.Samples = samples
	return err
}

func (s *loadService) Probe(in LoadProbe, id *int) error {
	var err error
	*id, err = s.g.probe(in.Owned, in.Victim, in.CrashAt)
	return err
}

func (s *loadService) Probed(id int, out *[]LoadFirstAsk) error {
	res, err := s.g.probed(id)
	for _, f := range res {
		*out = append(*out, LoadFirstAsk{Shard: f.shard, CrashAt: f.crashAt, Answered: f.answered, Routed: f.routed})
	}
	return err
}

// childLoad is the parent's side of the load child.
type childLoad struct {
	cmd    *exec.Cmd
	rpc    *rpc.Client
	stdin  io.Closer
	exited chan struct{} // closed when the child was reaped
	closed sync.Once
}

// loadChildWait bounds the child's exit once its input is closed.
const loadChildWait = 10 * time.Second

// startLoadChild starts the load child of spec; its log goes to logs.
func startLoadChild(spec loadSpec, logs io.Writer) (*childLoad, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envLoad+"="+string(b))
	cmd.SysProcAttr = testenv.ChildSysProcAttr()
	cmd.Stderr = logs
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the load child: %w", err)
	}
	c := &childLoad{cmd: cmd, stdin: stdin, exited: make(chan struct{})}
	c.rpc = rpc.NewClient(stdio{stdout, stdin})
	go func() {
		_ = cmd.Wait()
		close(c.exited)
	}()
	if err := c.rpc.Call("Load.Ready", struct{}{}, &struct{}{}); err != nil {
		c.close()
		return nil, fmt.Errorf("the load child did not start: %w", err)
	}
	return c, nil
}

func (c *childLoad) pid() int { return c.cmd.Process.Pid }

func (c *childLoad) begin() (time.Time, error) {
	var began time.Time
	err := c.rpc.Call("Load.Begin", struct{}{}, &began)
	return began, err
}

func (c *childLoad) finish() ([]askRec, map[string]string, error) {
	var w LoadAsks
	if err := c.rpc.Call("Load.Finish", struct{}{}, &w); err != nil {
		return nil, nil, err
	}
	if len(w.Dur) != len(w.At) || len(w.Class) != len(w.At) {
		return nil, nil, errors.New("the load child's asks do not add up")
	}
	asks := make([]askRec, len(w.At))
	for i := range asks {
		asks[i] = askRec{at: w.At[i], dur: w.Dur[i], class: w.Class[i]}
	}
	return asks, w.Samples, nil
}

func (c *childLoad) probe(owned []sharding.ShardID, victim string, crashAt time.Time) (int, error) {
	var id int
	err := c.rpc.Call("Load.Probe", LoadProbe{Owned: owned, Victim: victim, CrashAt: crashAt}, &id)
	return id, err
}

func (c *childLoad) probed(id int) ([]firstAsk, error) {
	var w []LoadFirstAsk
	if err := c.rpc.Call("Load.Probed", id, &w); err != nil {
		return nil, err
	}
	out := make([]firstAsk, len(w))
	for i, f := range w {
		out[i] = firstAsk{shard: f.Shard, crashAt: f.CrashAt, answered: f.Answered, routed: f.Routed}
	}
	return out, nil
}

// close ends the child: its input closes, it closes its gateway and exits
// (killed after loadChildWait).
func (c *childLoad) close() {
	c.closed.Do(func() {
		_ = c.stdin.Close()
		select {
		case <-c.exited:
		case <-time.After(loadChildWait):
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
		_ = c.rpc.Close()
	})
}
