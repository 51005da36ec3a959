package testenv

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// sysProcAttr makes the kernel SIGKILL the child when the test binary dies,
// so an aborted test (panic, go test -timeout) leaves no servers behind.
// Pdeathsig fires when the forking OS thread exits; the Go runtime only
// retires threads whose goroutine exits while locked to them, which the
// helpers never do.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// waitStopped waits until every thread of the process is stopped (state T)
// or, if stopped is false, none is. kill(2) returns before a SIGSTOP has
// taken effect: without this a request sent right after Pause can still be
// answered.
func waitStopped(pid int, stopped bool, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		all, any, err := threadsStopped(pid)
		if err != nil {
			return err
		}
		if (stopped && all) || (!stopped && !any) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d: stopped=%v not reached within %v", pid, stopped, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// threadsStopped reports whether all and whether any of the process's
// threads are in state T (stopped).
func threadsStopped(pid int) (all, any bool, err error) {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		return false, false, fmt.Errorf("process %d: no threads in /proc", pid)
	}
	all = true
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the thread exited
		}
		// "pid (comm) S ...": the state follows the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			continue
		}
		if b[i+2] == 'T' {
			any = true
		} else {
			all = false
		}
	}
	return all, any, nil
}
