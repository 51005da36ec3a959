package runnerproc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
)

// Bounds of the parent side.
const (
	reapTimeout  = 10 * time.Second // SIGKILL to exit
	signalWait   = time.Second      // SIGSTOP/SIGCONT to taking effect
	stderrTail   = 16 << 10
	maxLineBytes = 1 << 20
)

// ErrExited reports a child that exited before what was waited for.
var ErrExited = errors.New("runnerproc: child exited")

// Proc is a runner in a child process started by Start.
type Proc struct {
	spec Spec
	cmd  *exec.Cmd
	done chan struct{} // closed once the child exited and its output was read

	mu      sync.Mutex
	events  []Event
	changed chan struct{} // closed and replaced on every event
	addr    string
	waitErr error // valid once done is closed
	stderr  tail
}

// Start starts a child running spec (the calling program, re-executed; see
// the package documentation) and waits until its runner registered,
// bounded by ctx. On error the child has been killed and reaped.
func Start(ctx context.Context, spec Spec) (*Proc, error) {
	if spec.Config.ID == "" {
		return nil, errors.New("runnerproc: empty runner ID")
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("runnerproc: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("runnerproc: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envSpec+"="+string(b))
	cmd.SysProcAttr = testenv.ChildSysProcAttr()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("runnerproc: %w", err)
	}
	p := &Proc{spec: spec, cmd: cmd, done: make(chan struct{}), changed: make(chan struct{})}
	cmd.Stderr = &p.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("runnerproc: start %s: %w", spec.Config.ID, err)
	}
	go p.read(stdout)
	if _, err := p.WaitFor(ctx, func(ev Event) bool { return ev.Kind == KindRegistered }); err != nil {
		_ = p.Kill()
		return nil, fmt.Errorf("runnerproc: %s did not register: %w\nstderr tail:\n%s", spec.Config.ID, err, p.Stderr())
	}
	return p, nil
}

// read collects the child's events until its output ends, then reaps it.
func (p *Proc) read(stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes)
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue // not ours (a stray print); the child logs to stderr
		}
		p.mu.Lock()
		if ev.Kind == KindRegistered && ev.Address != "" {
			p.addr = ev.Address
		}
		p.events = append(p.events, ev)
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, stdout)
	err := p.cmd.Wait()
	p.mu.Lock()
	p.waitErr = err
	p.mu.Unlock()
	close(p.done)
}

// ID returns the runner's ID.
func (p *Proc) ID() string { return p.spec.Config.ID }

// PID returns the child's process ID.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Address returns where the runner serves its transport (from its last
// registration).
func (p *Proc) Address() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// Events returns the events received so far, in the child's order.
func (p *Proc) Events() []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.events)
}

// EventsSince returns the events received after the first n, and the count
// received so far (the n of the next call).
func (p *Proc) EventsSince(n int) ([]Event, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n >= len(p.events) {
		return nil, len(p.events)
	}
	return slices.Clone(p.events[n:]), len(p.events)
}

// WaitFor waits until an event satisfying match has been received (also
// one received before the call) and returns the first such event. It
// fails when ctx ends or the child exits first.
func (p *Proc) WaitFor(ctx context.Context, match func(Event) bool) (Event, error) {
	seen := 0
	for {
		p.mu.Lock()
		evs, changed := p.events[seen:], p.changed
		seen = len(p.events)
		p.mu.Unlock()
		for _, ev := range evs {
			if match(ev) {
				return ev, nil
			}
		}
		select {
		case <-changed:
		case <-p.done:
			p.mu.Lock()
			n := len(p.events)
			p.mu.Unlock()
			if n > seen {
				continue // events that arrived with the exit
			}
			return Event{}, fmt.Errorf("%w: %v", ErrExited, p.exitErr())
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// Done is closed once the child has exited and its output was read.
func (p *Proc) Done() <-chan struct{} { return p.done }

func (p *Proc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// Exited reports whether the child has exited, and how.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.exitErr()
	default:
		return false, nil
	}
}

// Stderr returns the tail of the child's log.
func (p *Proc) Stderr() string { return p.stderr.String() }

func (p *Proc) signal(sig syscall.Signal) error {
	if ok, _ := p.Exited(); ok {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("runnerproc: signal %v to %s: %w", sig, p.ID(), err)
	}
	return nil
}

func (p *Proc) wait(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		return fmt.Errorf("runnerproc: %s (pid %d) did not exit within %v", p.ID(), p.PID(), d)
	}
}

// Kill sends SIGKILL (a crash: no release, no revoke; the lease expires on
// the server) and waits for the child to exit.
func (p *Proc) Kill() error {
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	return p.wait(reapTimeout)
}

// Pause sends SIGSTOP and waits until the child is stopped: it keeps its
// connections but does nothing (a long GC pause, a frozen VM).
func (p *Proc) Pause() error {
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	return testenv.WaitStopped(p.PID(), true, signalWait)
}

// Resume sends SIGCONT to a paused child and waits until it runs.
func (p *Proc) Resume() error {
	if err := p.signal(syscall.SIGCONT); err != nil {
		return err
	}
	return testenv.WaitStopped(p.PID(), false, signalWait)
}

// Stop asks the runner to shut down gracefully (SIGTERM: Shutdown, bounded
// by 30 s in the child) and waits for the child to exit; when ctx ends
// first it kills the child and returns ctx's error.
func (p *Proc) Stop(ctx context.Context) error {
	_ = p.signal(syscall.SIGCONT) // a paused child cannot handle SIGTERM
	if err := p.signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		_ = p.Kill()
		return ctx.Err()
	}
}

// tail keeps the last stderrTail bytes written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - stderrTail; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(b), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
