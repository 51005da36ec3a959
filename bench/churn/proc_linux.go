package main

import "syscall"

// sysProcAttr makes the kernel SIGKILL the etcd child when the harness dies
// without cleaning up (a second ^C, a panic, go test -timeout).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
