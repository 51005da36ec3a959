package testenv

import (
	"os/exec"
	"syscall"
)

// browserProcAttr puts the browser in a process group of its own (its
// renderer and GPU helpers too) that dies with the test binary.
func browserProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killBrowser kills the browser's process group.
func killBrowser(cmd *exec.Cmd) error {
	return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}
