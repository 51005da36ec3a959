package testenv

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

var (
	errPortsExhausted = errors.New("testenv: no unused loopback port after 100 tries")
	errExited         = errors.New("testenv: process exited")
	errNotReaped      = errors.New("testenv: process not reaped in time")
	errNotStarted     = errors.New("testenv: process not started")
)

// Bounds on waiting for a child process.
const (
	stopGrace    = 3 * time.Second  // SIGTERM to SIGKILL in Stop and Restart
	cleanupGrace = time.Second      // SIGTERM to SIGKILL in t.Cleanup
	reapTimeout  = 10 * time.Second // SIGKILL to exit
	pollEvery    = 25 * time.Millisecond
	logTailSize  = 6 << 10
)

// process is one run of a child process. Its wait goroutine is owned by the
// process: it ends when the child exits, and every helper ends by waiting for
// done (stop and kill), so it never outlives the test.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the child has exited and been reaped
	err  error         // result of cmd.Wait, valid once done is closed
}

// startProcess starts bin with args, appending its stdout and stderr to the
// file logPath. The environment is the test's minus variables with a prefix
// in dropEnv (etcd reads ETCD_* variables as flags).
func startProcess(bin string, args []string, logPath string, dropEnv ...string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	fmt.Fprintf(logf, "=== testenv %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))

	cmd := exec.Command(bin, args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	for _, kv := range os.Environ() {
		if !hasAnyPrefix(kv, dropEnv) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// exited reports whether the child has exited and been reaped.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// signal sends sig unless the child has already been reaped.
func (p *process) signal(sig os.Signal) {
	if !p.exited() {
		_ = p.cmd.Process.Signal(sig) // os.ErrProcessDone when it raced with exit
	}
}

// pause sends SIGSTOP and waits until all threads are stopped.
func (p *process) pause() {
	p.signal(syscall.SIGSTOP)
	if !p.exited() {
		_ = waitStopped(p.pid(), true, time.Second) // fails only if it exits
	}
}

// resume sends SIGCONT and waits until no thread is stopped.
func (p *process) resume() {
	p.signal(syscall.SIGCONT)
	if !p.exited() {
		_ = waitStopped(p.pid(), false, time.Second)
	}
}

// wait waits up to d for the child to exit.
func (p *process) wait(d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
		return fmt.Errorf("%w: pid %d after %v", errNotReaped, p.pid(), d)
	}
}

// kill sends SIGKILL and waits for the child to exit.
func (p *process) kill() error {
	p.signal(syscall.SIGKILL)
	return p.wait(reapTimeout)
}

// stop sends SIGCONT (a paused child cannot handle SIGTERM) and SIGTERM,
// waits up to grace, then kills.
func (p *process) stop(grace time.Duration) error {
	p.signal(syscall.SIGCONT)
	p.signal(syscall.SIGTERM)
	if p.wait(grace) == nil {
		return nil
	}
	return p.kill()
}

// exitError describes how the child exited; call only once done is closed.
func (p *process) exitError() error {
	if p.err == nil {
		return fmt.Errorf("%w with status 0", errExited)
	}
	return fmt.Errorf("%w: %v", errExited, p.err)
}

// logTail returns the last few kilobytes of the file at path.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(log: %v)", err)
	}
	off := max(fi.Size()-logTailSize, 0)
	b, err := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	if err != nil {
		return fmt.Sprintf("(log: %v)", err)
	}
	s := string(b)
	if off > 0 {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = "...\n" + s[i+1:]
		}
	}
	return s
}

// logContains reports whether the file at path contains substr.
func logContains(path, substr string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(b), substr)
}

// ChildSysProcAttr returns the process attributes the helpers start their
// children with: on Linux a parent-death signal (SIGKILL), so a child does
// not outlive a test binary that dies without its cleanups; nil elsewhere.
// For packages that start processes of their own (bench/internal/runnerproc).
func ChildSysProcAttr() *syscall.SysProcAttr { return sysProcAttr() }

// WaitStopped waits, at most timeout, until every thread of process pid is
// stopped (after SIGSTOP) or, if stopped is false, none is (after SIGCONT):
// kill(2) returns before the signal has taken effect. Where the process
// state cannot be read (not Linux) it waits briefly instead.
func WaitStopped(pid int, stopped bool, timeout time.Duration) error {
	return waitStopped(pid, stopped, timeout)
}
