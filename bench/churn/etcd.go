package main

import (
	"context"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/storage/etcd"
)

// etcdServer is the etcd the harness runs on: a child process started from
// the repository's bin/ by testenv.LaunchEtcd (data in a temporary
// directory), or an existing etcd given with -etcd, in which the run uses a
// fresh namespace.
type etcdServer struct {
	Endpoint  string // host:port
	Namespace string
	Source    string // how it was obtained, for the report

	member *testenv.Etcd // nil for an existing etcd
	dir    string        // the member's data and log, removed by Close
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
	if e.member == nil {
		if cli, err := newEtcdClient(e.Endpoint, false); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, _ = cli.Delete(ctx, "/"+e.Namespace+"/", clientv3.WithPrefix())
			cancel()
			cli.Close()
		}
		return
	}
	_ = e.member.Close() // fails only if the child could not be reaped
	_ = os.RemoveAll(e.dir)
}

// startEtcd starts a single-member etcd from bin/ on free loopback ports
// (testenv.LaunchEtcd: the test helpers' start-up, with their retries,
// readiness wait and parent-death signal), with its data in a new
// temporary directory.
func startEtcd(ctx context.Context) (*etcdServer, error) {
	bin, err := etcdBinary()
	if err != nil {
		return nil, err
	}
	m, dir, err := testenv.LaunchEtcdTemp(ctx, "shardhost-churn-etcd-")
	if err != nil {
		return nil, err
	}
	return &etcdServer{Endpoint: m.Endpoint(), Namespace: "churn", Source: bin, member: m, dir: dir}, nil
}

// etcdBinary returns bin/etcd of the repository ($SHARDHOST_BIN/etcd when
// that is set, as for the tests), or an error saying to run `make setup`.
func etcdBinary() (string, error) {
	path, err := testenv.BinaryPath("etcd")
	if err != nil {
		return "", fmt.Errorf("%w (or pass -etcd host:port)", err)
	}
	return path, nil
}
