package testenv

import (
	"net"
	"strconv"
	"sync"
	"testing"
)

// handedOut holds every port FreePort returned in this process, so that two
// servers started by one test binary never get the same port even after the
// first one has exited.
var handedOut struct {
	sync.Mutex
	ports map[int]struct{}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago and has
// not been returned before in this process. Another process may still take it
// before the caller binds it; the etcd and toxiproxy helpers retry start-up
// with fresh ports when that happens.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	return port
}

// FreeAddr returns "127.0.0.1:port" for a port from [FreePort].
func FreeAddr(t testing.TB) string {
	t.Helper()
	return hostPort(FreePort(t))
}

func hostPort(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

func freePort() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = make(map[int]struct{})
	}
	var lastErr error
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			lastErr = err
			continue
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if _, used := handedOut.ports[port]; used {
			continue
		}
		handedOut.ports[port] = struct{}{}
		return port, nil
	}
	if lastErr == nil {
		lastErr = errPortsExhausted
	}
	return 0, lastErr
}

// reservePort records a port chosen by someone else (a toxiproxy listener on
// port 0) so that FreePort never returns it.
func reservePort(port int) {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = make(map[int]struct{})
	}
	handedOut.ports[port] = struct{}{}
}
