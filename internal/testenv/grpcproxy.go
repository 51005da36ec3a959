package testenv

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// GRPCProxy is an etcd gRPC proxy (`etcd grpc-proxy start`) in front of
// etcd members: clients connect to it as to etcd, and it coalesces their
// identical watches into one watch on the members.
type GRPCProxy struct {
	addr    string
	proc    *process
	logPath string
}

// StartEtcdGRPCProxy starts a gRPC proxy on a free loopback port in front
// of the plaintext members at endpoints (host:port) and waits until it
// accepts connections. It is stopped when t ends.
func StartEtcdGRPCProxy(t testing.TB, endpoints ...string) *GRPCProxy {
	t.Helper()
	bin := Binary(t, "etcd")
	dir := t.TempDir()
	var lastErr error
	for range 3 { // another process may take the port between FreePort and bind
		p := &GRPCProxy{addr: FreeAddr(t), logPath: filepath.Join(dir, "grpc-proxy.log")}
		args := []string{"grpc-proxy", "start", "--listen-addr", p.addr, "--data-dir", filepath.Join(dir, "proxy-data")}
		for _, e := range endpoints {
			args = append(args, "--endpoints", e)
		}
		proc, err := startProcess(bin, args, p.logPath, "ETCD_", "ETCDCTL_")
		if err != nil {
			t.Fatalf("testenv: grpc-proxy: %v", err)
		}
		p.proc = proc
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var d net.Dialer
		lastErr = poll(ctx, proc, func(ctx context.Context) error {
			c, err := d.DialContext(ctx, "tcp", p.addr)
			if err == nil {
				c.Close()
			}
			return err
		})
		cancel()
		if lastErr == nil {
			t.Cleanup(func() { _ = proc.stop(cleanupGrace) })
			return p
		}
		_ = proc.kill()
	}
	t.Fatalf("testenv: grpc-proxy did not start: %v\n%s", lastErr, logTail(filepath.Join(dir, "grpc-proxy.log")))
	return nil
}

// Endpoint is the proxy's client address, host:port.
func (p *GRPCProxy) Endpoint() string { return p.addr }

// PID is the proxy's process ID.
func (p *GRPCProxy) PID() int { return p.proc.pid() }

// String names the proxy in logs.
func (p *GRPCProxy) String() string { return fmt.Sprintf("grpc-proxy %s (pid %d)", p.addr, p.PID()) }
