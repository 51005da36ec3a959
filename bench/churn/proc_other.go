//go:build !linux

package main

import "syscall"

// sysProcAttr: no parent-death signal outside Linux; the harness kills the
// child on its way out (including on SIGINT).
func sysProcAttr() *syscall.SysProcAttr { return nil }
