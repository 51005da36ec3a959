package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/storage/etcd"
)

// etcdReadyTimeout bounds waiting for a started etcd to answer /readyz.
const etcdReadyTimeout = 20 * time.Second

// etcdServer is the etcd the harness runs on: a child process started from
// the repository's bin/ (data in a temporary directory), or an existing
// etcd given with -etcd, in which the run uses a fresh namespace.
type etcdServer struct {
	Endpoint  string // host:port
	Namespace string
	Source    string // how it was obtained, for the report

	cmd  *exec.Cmd     // nil for an existing etcd
	done chan struct{} // closed when the child has been reaped
	dir  string
}

// openEtcd starts ./bin/etcd when addr is "", else checks that the etcd at
// addr answers and picks a namespace of its own there.
func openEtcd(ctx context.Context, addr string) (*etcdServer, error) {
	if addr == "" {
		return startEtcd(ctx)
	}
	e := &etcdServer{
		Endpoint:  addr,
		Namespace: fmt.Sprintf("churn-%d", time.Now().UnixNano()),
		Source:    "existing etcd at " + addr,
	}
	cli, err := newEtcdClient(addr, false)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := cli.Get(cctx, "/"+e.Namespace+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		return nil, fmt.Errorf("etcd at %s does not answer: %w", addr, err)
	}
	return e, nil
}

// newEtcdClient connects to endpoint with shardhost's recommended settings;
// the client's own logging is discarded unless verbose.
func newEtcdClient(endpoint string, verbose bool) (*clientv3.Client, error) {
	cfg := etcd.ClientConfig([]string{endpoint})
	if !verbose {
		cfg.Logger = zap.NewNop()
	}
	return clientv3.New(cfg)
}

// Close stops the child etcd and removes its data, or deletes the run's
// namespace from an existing etcd. Safe to call on a nil server.
func (e *etcdServer) Close() {
	if e == nil {
		return
	}
	if e.cmd == nil {
		if cli, err := newEtcdClient(e.Endpoint, false); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, _ = cli.Delete(ctx, "/"+e.Namespace+"/", clientv3.WithPrefix())
			cancel()
			cli.Close()
		}
		return
	}
	e.stop()
	_ = os.RemoveAll(e.dir)
}

// stop sends SIGTERM, waits up to 2 s, then kills and reaps the child.
func (e *etcdServer) stop() {
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
		return
	case <-time.After(2 * time.Second):
	}
	_ = e.cmd.Process.Kill()
	<-e.done
}

// startEtcd starts a single-member etcd from bin/ on free loopback ports,
// trying three times (a port found free may be taken before etcd binds it).
func startEtcd(ctx context.Context) (*etcdServer, error) {
	bin, err := etcdBinary()
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		e, err := tryEtcd(ctx, bin)
		if err == nil || attempt == 3 || ctx.Err() != nil {
			return e, err
		}
	}
}

func tryEtcd(ctx context.Context, bin string) (*etcdServer, error) {
	dir, err := os.MkdirTemp("", "shardhost-churn-etcd-")
	if err != nil {
		return nil, err
	}
	clientPort, err1 := freePort()
	peerPort, err2 := freePort()
	if err := errors.Join(err1, err2); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	clientURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(clientPort))
	peerURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(peerPort))
	logPath := filepath.Join(dir, "etcd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(bin,
		"--name", "churn",
		"--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", clientURL,
		"--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "churn="+peerURL,
		"--heartbeat-interval", "50",
		"--election-timeout", "500",
		"--log-level", "error",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	cmd.Env = []string{}
	for _, kv := range os.Environ() { // etcd reads ETCD_* variables as flags
		if !strings.HasPrefix(kv, "ETCD_") && !strings.HasPrefix(kv, "ETCDCTL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	e := &etcdServer{
		Endpoint:  strings.TrimPrefix(clientURL, "http://"),
		Namespace: "churn",
		Source:    bin,
		cmd:       cmd,
		done:      make(chan struct{}),
		dir:       dir,
	}
	go func() {
		_ = cmd.Wait()
		close(e.done)
	}()
	if err := e.waitReady(ctx, clientURL+"/readyz"); err != nil {
		e.stop()
		tail := logTail(logPath)
		os.RemoveAll(dir)
		return nil, fmt.Errorf("etcd %s: %w\netcd log tail:\n%s", bin, err, tail)
	}
	return e, nil
}

// waitReady polls url until it answers 200, the child exits or the timeout.
func (e *etcdServer) waitReady(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, etcdReadyTimeout)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}, Timeout: 500 * time.Millisecond}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		select {
		case <-e.done:
			return fmt.Errorf("exited before becoming ready: %v", e.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w (last probe: %v)", context.Cause(ctx), err)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// etcdBinary returns bin/etcd of the repository ($SHARDHOST_BIN/etcd when
// that is set, as for the tests), or an error saying to run `make setup`.
func etcdBinary() (string, error) {
	dir, err := testenv.BinDir()
	if err != nil {
		return "", fmt.Errorf("%w; run `make setup` in the repository root to build the pinned binaries into bin/ (or pass -etcd host:port)", err)
	}
	path := filepath.Join(dir, "etcd")
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return "", fmt.Errorf("etcd binary: %w; run `make setup` in the repository root to build the pinned binaries into bin/", err)
	case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
		return "", fmt.Errorf("etcd binary: %s is not an executable file; run `make setup` in the repository root", path)
	}
	return path, nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// logTail returns the last 4 KiB of the file at path.
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
	off := max(fi.Size()-4<<10, 0)
	b, _ := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	return string(b)
}
