//go:build !linux

package testenv

import (
	"os/exec"
	"syscall"
)

func browserProcAttr() *syscall.SysProcAttr { return nil }

// killBrowser kills the browser process (its helpers exit when it does).
func killBrowser(cmd *exec.Cmd) error { return cmd.Process.Kill() }
