package testenv

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Clusters of etcd members: started together on free loopback ports,
// stopped and cleaned up with the test, their logs kept on failure.

// EtcdCluster is a set of etcd members started together by
// [StartEtcdCluster] with a static initial cluster on loopback. When the test
// ends all members get SIGTERM at once and SIGKILL after 1 s: a graceful stop
// of a member whose peers are alive takes about a second in etcd, and a
// leader stopping alongside its followers can hang for its 6 s request
// timeout, so a cluster's cleanup costs about 1 s.
type EtcdCluster struct {
	token   string
	members []*Etcd
	cfg     etcdConfig
	probe   *http.Client // readiness probes
	admin   Cert         // the helpers' client certificate (WithTLS)
	rootPw  string       // root's password (WithAuth)
}

var clusterSeq atomic.Int64

// StartEtcdCluster starts an n-member etcd cluster on loopback and waits
// until every member is ready (/readyz: each knows the leader and serves
// linearizable reads, so writes through any member succeed). Start-up is
// retried with fresh ports if another process took one of them; the test
// fails if the cluster is not ready within the start timeout (20 s by
// default). All members are stopped when t ends.
func StartEtcdCluster(t testing.TB, n int, opts ...EtcdOption) *EtcdCluster {
	t.Helper()
	SkipIfShort(t, "starts etcd")
	onFailureRealTime(t)
	start := time.Now()
	c, err := launchCluster(context.Background(), n, t.TempDir(), opts, t.Logf)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { c.cleanup(t) })
	t.Logf("testenv: etcd cluster of %d ready in %v: %v", n, time.Since(start).Round(time.Millisecond), c.Endpoints())
	return c
}

// LaunchEtcdCluster starts an n-member cluster on loopback with its data
// directories and logs in dir, and waits until every member is ready. It
// is [StartEtcdCluster] for programs that are not tests: the caller stops
// the cluster with [EtcdCluster.Close] and owns dir.
func LaunchEtcdCluster(ctx context.Context, n int, dir string, opts ...EtcdOption) (*EtcdCluster, error) {
	return launchCluster(ctx, n, dir, opts, nil)
}

// Close stops every member at once (SIGTERM, SIGKILL after 1 s) and waits
// for them to exit: how the caller of [LaunchEtcdCluster] stops it. It does
// not remove the data directories.
func (c *EtcdCluster) Close() error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, m := range c.members {
		p := m.current()
		if p == nil {
			continue
		}
		wg.Go(func() {
			if err := p.stop(cleanupGrace); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("etcd %s: %w", m.name, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("testenv: stop etcd: %w", err)
	}
	return nil
}

// LogTails returns the tail of every member's log, for error reports.
func (c *EtcdCluster) LogTails() string { return c.logTails() }

// launchCluster starts an n-member cluster with its data directories and
// logs in base and waits until every member is ready. It reports retries
// with logf (if not nil). On error, every member it started has been
// killed and reaped.
func launchCluster(ctx context.Context, n int, base string, opts []EtcdOption, logf func(format string, args ...any)) (*EtcdCluster, error) {
	cfg, err := newEtcdConfig(opts)
	if err != nil {
		return nil, fmt.Errorf("testenv: etcd options: %w", err)
	}
	if n < 1 {
		return nil, fmt.Errorf("testenv: etcd cluster of %d members", n)
	}
	bin, err := BinaryPath("etcd")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	c := &EtcdCluster{token: fmt.Sprintf("testenv-%d-%d", os.Getpid(), clusterSeq.Add(1)), cfg: cfg, probe: plainProbe}
	if cfg.pki != nil {
		if c.admin, err = cfg.pki.Issue(c.token+"-admin", WithCommonName("testenv-admin")); err != nil {
			return nil, err
		}
		c.probe = newProbeClient(cfg.pki.ClientTLS(c.admin))
	}
	if cfg.auth {
		c.rootPw = rand.Text()
	}
	for i := range n {
		name := fmt.Sprintf("m%d", i)
		m := &Etcd{
			name:    name,
			bin:     bin,
			dataDir: filepath.Join(base, name+".etcd"),
			logPath: filepath.Join(base, name+".log"),
			cfg:     cfg,
			cluster: c,
		}
		if cfg.pki != nil {
			if m.cert, err = cfg.pki.Issue(m.certName()); err != nil {
				return nil, err
			}
		}
		c.members = append(c.members, m)
	}

	const attempts = 3
	for attempt := 1; ; attempt++ {
		err := c.start(ctx)
		if err == nil {
			break
		}
		c.killAll()
		inUse := false
		for _, m := range c.members {
			inUse = inUse || logContains(m.logPath, "address already in use")
		}
		if !inUse || attempt == attempts || ctx.Err() != nil {
			return nil, fmt.Errorf("testenv: start etcd cluster of %d (attempt %d): %w\n%s", n, attempt, err, c.logTails())
		}
		if logf != nil {
			logf("testenv: etcd port taken by another process, retrying with new ports: %v", err)
		}
		for _, m := range c.members {
			if err := os.RemoveAll(m.dataDir); err != nil {
				return nil, fmt.Errorf("testenv: %w", err)
			}
		}
	}
	for _, m := range c.members {
		m.mu.Lock()
		m.started = true
		m.mu.Unlock()
	}
	if cfg.auth {
		if err := c.enableAuth(ctx); err != nil {
			c.killAll()
			return nil, fmt.Errorf("testenv: etcd cluster of %d: %w\n%s", n, err, c.logTails())
		}
	}
	return c, nil
}

// enableAuth adds root (with the root role) and enables authentication.
func (c *EtcdCluster) enableAuth(ctx context.Context) error {
	cfg := c.clientConfig(c.Endpoints()...)
	cfg.Username, cfg.Password = "", "" // auth is not enabled yet
	cli, err := clientv3.New(cfg)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.startTimeout)
	defer cancel()
	if _, err := cli.UserAdd(ctx, "root", c.rootPw); err != nil {
		return fmt.Errorf("add user root: %w", err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		return fmt.Errorf("grant role root: %w", err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("auth enable: %w", err)
	}
	return nil
}

// scheme is the members' client URL scheme.
func (c *EtcdCluster) scheme() string {
	if c.cfg.pki != nil {
		return "https://"
	}
	return "http://"
}

// clientConfig is EtcdClientConfig(endpoints...) with the admin
// certificate (WithTLS) and root's credentials (WithAuth).
func (c *EtcdCluster) clientConfig(endpoints ...string) clientv3.Config {
	cfg := EtcdClientConfig(endpoints...)
	if c.cfg.pki != nil {
		cfg.TLS = c.cfg.pki.ClientTLS(c.admin)
	}
	if c.cfg.auth {
		cfg.Username, cfg.Password = "root", c.rootPw
	}
	return cfg
}

// ClientConfig returns the configuration of [EtcdCluster.Client]:
// [EtcdClientConfig] for every member, with the admin certificate
// ([WithTLS]) and root's credentials ([WithAuth]).
func (c *EtcdCluster) ClientConfig() clientv3.Config { return c.clientConfig(c.Endpoints()...) }

// PKI returns the CA given to [WithTLS] (nil without).
func (c *EtcdCluster) PKI() *PKI { return c.cfg.pki }

// AdminCert returns the client certificate the helpers present
// ([WithTLS]; the zero Cert without). Its common name, "testenv-admin",
// is no etcd user.
func (c *EtcdCluster) AdminCert() Cert { return c.admin }

// RootPassword returns the password of etcd's root user ([WithAuth]; ""
// without).
func (c *EtcdCluster) RootPassword() string { return c.rootPw }

// Cluster returns the cluster the member belongs to (a single member's own
// one-member cluster from [StartEtcd] or [LaunchEtcd]).
func (e *Etcd) Cluster() *EtcdCluster { return e.cluster }

// start assigns fresh ports to every member, launches them and waits until
// all are ready, bounded by ctx and the start timeout.
func (c *EtcdCluster) start(ctx context.Context) error {
	for _, m := range c.members {
		client, err1 := freePorts(1)
		peer, err2 := freePorts(1)
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("free port: %w", err)
		}
		m.mu.Lock()
		m.clientPort, m.peerPort = client, peer
		m.mu.Unlock()
	}
	for _, m := range c.members {
		if err := m.launch(); err != nil {
			return fmt.Errorf("etcd %s: %w", m.name, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, c.members[0].cfg.startTimeout)
	defer cancel()
	for _, m := range c.members {
		if err := m.waitReady(ctx); err != nil {
			return fmt.Errorf("etcd %s: %w", m.name, err)
		}
	}
	return nil
}

func (c *EtcdCluster) initialCluster() string {
	parts := make([]string, len(c.members))
	for i, m := range c.members {
		m.mu.Lock()
		parts[i] = m.name + "=http://" + hostPort(m.peerPort)
		m.mu.Unlock()
	}
	return strings.Join(parts, ",")
}

// quorumRunning reports whether a majority of members have a live process.
func (c *EtcdCluster) quorumRunning() bool {
	return c.runningCount() > len(c.members)/2
}

func (c *EtcdCluster) runningCount() int {
	n := 0
	for _, m := range c.members {
		if m.Running() {
			n++
		}
	}
	return n
}

// killAll kills every member concurrently and waits for them to exit.
func (c *EtcdCluster) killAll() {
	var wg sync.WaitGroup
	for _, m := range c.members {
		wg.Go(m.Kill)
	}
	wg.Wait()
}

// cleanup stops all members concurrently (SIGTERM, SIGKILL after
// cleanupGrace), reaps them, and prints the logs' tails if the test failed.
//
// A lone member stops gracefully in milliseconds. In a cluster a graceful
// stop cannot be quick: a member whose peers are still connected waits up
// to 1 s for their connections to close, and a leader tries to hand
// leadership to a follower, which waits for the request timeout (6 s) when
// the follower is stopping too or has just died. The data is thrown away, so
// cleanup does not wait for that.
func (c *EtcdCluster) cleanup(t testing.TB) {
	start := time.Now()
	err := c.Close()
	t.Logf("testenv: etcd stopped in %v", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Errorf("%v", err)
	}
	if t.Failed() {
		t.Logf("testenv: etcd logs (test failed):\n%s", c.logTails())
		c.keepLogs(t)
	}
}

// KeepLogsEnv names a directory into which the whole logs of a failed
// test's etcd members are copied (the temp dir holding them is removed when
// the test ends), as {test name}-{member}.log.
const KeepLogsEnv = "SHARDHOST_KEEP_LOGS"

func (c *EtcdCluster) keepLogs(t testing.TB) {
	dir := os.Getenv(KeepLogsEnv)
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("testenv: %s: %v", KeepLogsEnv, err)
		return
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	for _, m := range c.members {
		b, err := os.ReadFile(m.logPath)
		if err == nil {
			dst := filepath.Join(dir, name+"-"+m.name+".log")
			err = os.WriteFile(dst, b, 0o644)
			t.Logf("testenv: etcd %s log kept in %s", m.name, dst)
		}
		if err != nil {
			t.Logf("testenv: keep etcd %s log: %v", m.name, err)
		}
	}
}

func (c *EtcdCluster) logTails() string {
	var b strings.Builder
	for _, m := range c.members {
		fmt.Fprintf(&b, "--- etcd %s log tail (%s):\n%s\n", m.name, m.logPath, logTail(m.logPath))
	}
	return b.String()
}

// Members returns the members, in start order (m0, m1, ...).
func (c *EtcdCluster) Members() []*Etcd {
	return append([]*Etcd(nil), c.members...)
}

// Endpoints returns every member's client address, "127.0.0.1:port", in
// member order.
func (c *EtcdCluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.Endpoint()
	}
	return eps
}

// Client returns a new client for all members' endpoints, closed when t
// ends (configured by [EtcdCluster.ClientConfig]).
func (c *EtcdCluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	return NewEtcdClientWith(t, c.ClientConfig())
}

// WaitReady waits until every running member answers /readyz, failing the
// test after the start timeout.
func (c *EtcdCluster) WaitReady(t testing.TB) {
	t.Helper()
	for _, m := range c.members {
		if m.Running() {
			m.WaitReady(t)
		}
	}
}

// Leader returns the running member that reports itself as the raft leader,
// waiting (up to the start timeout) while there is none.
func (c *EtcdCluster) Leader(t testing.TB) *Etcd {
	t.Helper()
	m, err := c.LeaderContext(context.Background())
	if err != nil {
		t.Fatalf("%v", err)
	}
	return m
}

// LeaderContext is [EtcdCluster.Leader] for programs that are not tests:
// it waits, bounded by ctx and the start timeout, and returns an error
// when no member is the leader by then.
func (c *EtcdCluster) LeaderContext(ctx context.Context) (*Etcd, error) {
	ctx, cancel := context.WithTimeout(ctx, c.members[0].cfg.startTimeout)
	defer cancel()
	for {
		m, err := c.leader(ctx)
		if m != nil {
			return m, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("testenv: no etcd leader: %w (last: %v)", ctx.Err(), err)
		case <-time.After(pollEvery):
		}
	}
}

// leader asks each running member whether it is the leader. It uses the
// gRPC Status call: asking through etcd's HTTP/JSON gateway instead
// (/v3/maintenance/status) makes that member's graceful stop take about a
// second longer.
func (c *EtcdCluster) leader(ctx context.Context) (*Etcd, error) {
	var running []*Etcd
	for _, m := range c.members {
		if m.Running() {
			running = append(running, m)
		}
	}
	if len(running) == 0 {
		return nil, errors.New("no member is running")
	}
	eps := make([]string, len(running))
	for i, m := range running {
		eps[i] = m.Endpoint()
	}
	cli, err := clientv3.New(c.clientConfig(eps...))
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	var errs []error
	for _, m := range running {
		sctx, cancel := context.WithTimeout(ctx, probeTimeout)
		st, err := cli.Status(sctx, m.Endpoint())
		cancel()
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("etcd %s: %w", m.name, err))
		case st.Leader != 0 && st.Leader == st.Header.MemberId:
			return m, nil
		}
	}
	if len(errs) == 0 {
		return nil, errors.New("no running member is the leader")
	}
	return nil, errors.Join(errs...)
}
