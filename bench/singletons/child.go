package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// A runner in a child process, for the crash scenario's SIGKILL: the
// harness's own binary re-executed (os.Executable, the bench command or
// the test binary) with a childSpec in the environment variable envChild.
// main (and TestMain) call childMain first: in a child it runs the runner
// until SIGTERM (graceful Shutdown) or SIGKILL, and exits. The child's
// singletons and entities print their records as JSON lines on its
// standard output, which the harness feeds into its lifeLog.

const envChild = "SHARDHOST_BENCH_SINGLETONS_CHILD"

type childSpec struct {
	Endpoint   string        `json:"endpoint"`
	Namespace  string        `json:"namespace"`
	ID         string        `json:"id"`
	Shards     int           `json:"shards"`
	LeaseTTL   time.Duration `json:"leaseTTL"`
	StartRate  int           `json:"startRate"`
	Singletons int           `json:"singletons"`
	Verbose    bool          `json:"verbose"`
}

// childLine is one record of a child.
type childLine struct {
	Kind   string        `json:"k"` // "start", "end", "act", "rel"
	Name   string        `json:"name,omitempty"`
	Runner string        `json:"runner,omitempty"`
	Epoch  storage.Epoch `json:"epoch,omitempty"`
	At     time.Time     `json:"at,omitzero"`
	Act    *activation   `json:"act,omitempty"`
}

// childMain runs the child and exits when this process is one; otherwise
// it returns at once.
func childMain() {
	s, ok := os.LookupEnv(envChild)
	if !ok {
		return
	}
	var spec childSpec
	if err := json.Unmarshal([]byte(s), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "singletons child: bad %s: %v\n", envChild, err)
		os.Exit(2)
	}
	if err := runChild(spec); err != nil {
		fmt.Fprintf(os.Stderr, "singletons child %s: %v\n", spec.ID, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// lineSink prints the records, one write per line (a kill never splits
// one).
type lineSink struct {
	mu   sync.Mutex
	runs []childLine // by run index: name, runner, epoch
}

func (s *lineSink) emit(l childLine) {
	b, err := json.Marshal(l)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = os.Stdout.Write(append(b, '\n'))
}

func (s *lineSink) singletonStarted(name, runner string, epoch storage.Epoch, at time.Time) int {
	l := childLine{Kind: "start", Name: name, Runner: runner, Epoch: epoch, At: at}
	s.emit(l)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs = append(s.runs, l)
	return len(s.runs) - 1
}

func (s *lineSink) singletonReturned(run int, at time.Time) {
	s.mu.Lock()
	l := s.runs[run]
	s.mu.Unlock()
	l.Kind, l.At = "end", at
	s.emit(l)
}

func (s *lineSink) activated(a activation) { s.emit(childLine{Kind: "act", Act: &a}) }

func (s *lineSink) released(a activation) { s.emit(childLine{Kind: "rel", Act: &a}) }

func runChild(spec childSpec) error {
	setSink(&lineSink{})
	cli, err := client(spec.Endpoint)
	if err != nil {
		return err
	}
	defer cli.Close()
	store, err := etcd.New(cli, spec.Namespace, etcd.Config{})
	if err != nil {
		return err
	}
	cfg := (&env{p: params{shards: spec.Shards, ttl: spec.LeaseTTL, startRate: spec.StartRate}, transport: true}).runnerConfig(spec.ID)
	r, err := newRunner(store, cfg, spec.Singletons, spec.Verbose)
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	defer signal.Stop(sigs)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case err := <-done:
		return fmt.Errorf("runner stopped: %w", err)
	case <-sigs:
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := r.Shutdown(ctx)
		cancel()
		<-done
		return err
	}
}

// child is a runner process started by the harness.
type child struct {
	id     string
	cmd    *exec.Cmd
	done   chan struct{} // closed once it exited and its output was read
	killed atomic.Bool
}

// startChild starts runner id in a child process.
func (e *env) startChild(id string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	spec, err := json.Marshal(childSpec{Endpoint: e.etcd.Endpoint(), Namespace: e.ns, ID: id, Shards: e.p.shards,
		LeaseTTL: e.p.ttl, StartRate: e.p.startRate, Singletons: e.p.singletons, Verbose: e.p.verbose})
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envChild+"="+string(spec))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = testenv.ChildSysProcAttr()
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start child %s: %w", id, err)
	}
	k := &child{id: id, cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(k.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var l childLine
			if json.Unmarshal(sc.Bytes(), &l) != nil {
				continue
			}
			switch l.Kind {
			case "start":
				e.life.singletonStarted(l.Name, l.Runner, l.Epoch, l.At)
			case "end":
				e.life.returnedOn(l.Name, l.Runner, l.Epoch, l.At)
			case "act":
				if l.Act != nil {
					e.life.activated(*l.Act)
				}
			case "rel":
				if l.Act != nil {
					e.life.released(*l.Act)
				}
			}
		}
		_ = cmd.Wait()
	}()
	e.kids = append(e.kids, k)
	return k, nil
}

// kill sends SIGKILL and waits for the process to exit; it returns the
// instant just before the signal.
func (k *child) kill() time.Time {
	at := time.Now()
	if !k.killed.Swap(true) {
		_ = k.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-k.done
	return at
}

// dead reports whether the child was killed or exited.
func (k *child) dead() bool {
	if k.killed.Load() {
		return true
	}
	select {
	case <-k.done:
		return true
	default:
		return false
	}
}
