package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
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
// not been returned before in this process. It is outside the kernel's
// ephemeral range (see portRange), so no outgoing connection of any process
// takes it before the caller binds it; another test process picking the
// same port in that moment still can, and the etcd and toxiproxy helpers
// retry start-up with fresh ports when that happens.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := freePorts(1)
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	return port
}

// FreePortRange returns the first of n consecutive ports on 127.0.0.1, as
// FreePort returns one, for a program that takes a base port (the demo's
// run.sh).
func FreePortRange(t testing.TB, n int) int {
	t.Helper()
	port, err := freePorts(n)
	if err != nil {
		t.Fatalf("testenv: %d free consecutive ports: %v", n, err)
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

// portRange is where FreePort picks: below the kernel's ephemeral range
// (ip_local_port_range; Linux's default 32768-60999), or above it when it
// starts low. A port of that range, free when checked, is handed by the
// kernel to the next outgoing connection of any process as soon as it is
// free: with the suite's packages beside each other (thousands of etcd and
// gRPC connections), a server started seconds later on it found it in use.
func portRange() (lo, hi int) {
	lo, hi = 10000, 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lo, hi
	}
	first, err1 := strconv.Atoi(f[0])
	last, err2 := strconv.Atoi(f[1])
	switch {
	case err1 != nil || err2 != nil:
		return lo, hi
	case first >= lo+10000:
		return lo, first
	default:
		return last + 1, 65536
	}
}

// freePorts returns the first of n consecutive free ports of portRange,
// none returned before in this process.
func freePorts(n int) (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = make(map[int]struct{})
	}
	lo, hi := portRange()
	if hi-lo < 100*n {
		return 0, fmt.Errorf("testenv: no room for %d ports outside the ephemeral range (%d-%d)", n, lo, hi)
	}
	var lastErr error
	for range 100 {
		base := lo + rand.IntN(hi-lo-n)
		ok := true
		for p := base; p < base+n && ok; p++ {
			_, used := handedOut.ports[p]
			ok = !used
		}
		var ls []net.Listener
		for p := base; p < base+n && ok; p++ {
			l, err := net.Listen("tcp", hostPort(p))
			if err != nil {
				lastErr, ok = err, false
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if !ok {
			continue
		}
		for p := base; p < base+n; p++ {
			handedOut.ports[p] = struct{}{}
		}
		return base, nil
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
