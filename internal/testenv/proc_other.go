//go:build !linux

package testenv

import (
	"syscall"
	"time"
)

// sysProcAttr returns nil: only Linux has a parent-death signal. Children of
// a test binary that dies without cleanups must be killed by hand.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// waitStopped cannot observe the process state here; it gives the signal a
// moment to take effect.
func waitStopped(pid int, stopped bool, timeout time.Duration) error {
	time.Sleep(min(timeout, 50*time.Millisecond))
	return nil
}
