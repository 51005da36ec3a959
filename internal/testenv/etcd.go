package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdOption changes how [StartEtcd], [StartEtcdCluster] and [LaunchEtcd]
// run members.
type EtcdOption func(*etcdConfig)

type etcdConfig struct {
	heartbeat    time.Duration
	election     time.Duration
	logLevel     string
	startTimeout time.Duration
	extraArgs    []string
	pki          *PKI // WithTLS
	auth         bool // WithAuth
}

// WithRaftTiming sets --heartbeat-interval and --election-timeout (whole
// milliseconds). The default is 50 ms and 500 ms; election must be at least
// five heartbeats, as etcd requires.
func WithRaftTiming(heartbeat, election time.Duration) EtcdOption {
	return func(c *etcdConfig) { c.heartbeat, c.election = heartbeat, election }
}

// WithLogLevel sets etcd's --log-level (debug, info, warn, error, panic,
// fatal). The default is error. The log goes to a file in the test's temp
// directory whose tail is printed if the test fails.
func WithLogLevel(level string) EtcdOption {
	return func(c *etcdConfig) { c.logLevel = level }
}

// WithStartTimeout bounds how long starting or restarting waits for members
// to become ready before the test fails (or LaunchEtcd returns an error).
// The default is 20 s.
func WithStartTimeout(d time.Duration) EtcdOption {
	return func(c *etcdConfig) { c.startTimeout = d }
}

// WithEtcdArgs appends flags to every member's command line, for instance
// "--auto-compaction-retention=1" or "--unsafe-no-fsync". Flags that the
// helpers set themselves (name, data dir, URLs, initial cluster, timing, log
// level) must not be repeated.
func WithEtcdArgs(args ...string) EtcdOption {
	return func(c *etcdConfig) { c.extraArgs = append(c.extraArgs, args...) }
}

// WithTLS serves the members' client URLs over TLS (https://) with a
// server certificate issued by pki for 127.0.0.1 (one per member, see
// [Etcd.ServerCert]) and requires every client to present a certificate
// issued by pki (--client-cert-auth --trusted-ca-file). Peer URLs stay
// plaintext (loopback). The helpers' own clients ([Etcd.Client],
// [Etcd.ClientConfig], [Etcd.Etcdctl] and the readiness probes) present
// the cluster's admin certificate ([EtcdCluster.AdminCert], common name
// "testenv-admin": not an etcd user, so it grants nothing by itself when
// auth is enabled).
func WithTLS(pki *PKI) EtcdOption {
	return func(c *etcdConfig) { c.pki = pki }
}

// WithAuth enables etcd authentication once the cluster first starts: a
// user "root" with a random password ([EtcdCluster.RootPassword]) and the
// root role is added, then `auth enable`. The helpers' own clients log in
// as root. Data directories keep it across restarts. Passwords are hashed
// with --bcrypt-cost 4, etcd's minimum (a later --bcrypt-cost in
// [WithEtcdArgs] wins): at etcd's default, 10, a login costs the server
// about 70 ms of CPU on a 2-core machine, and tests that log in a few
// dozen clients at once then miss their dial timeouts under load.
func WithAuth() EtcdOption {
	return func(c *etcdConfig) { c.auth = true }
}

// newEtcdConfig applies opts over the defaults and validates the result.
func newEtcdConfig(opts []EtcdOption) (etcdConfig, error) {
	c := etcdConfig{
		heartbeat:    50 * time.Millisecond,
		election:     500 * time.Millisecond,
		logLevel:     "error",
		startTimeout: 20 * time.Second,
	}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case c.heartbeat < time.Millisecond || c.heartbeat%time.Millisecond != 0:
		return c, fmt.Errorf("heartbeat %v: want whole milliseconds >= 1ms", c.heartbeat)
	case c.election%time.Millisecond != 0:
		return c, fmt.Errorf("election timeout %v: want whole milliseconds", c.election)
	case c.election < 5*c.heartbeat:
		return c, fmt.Errorf("election timeout %v < 5 × heartbeat %v", c.election, c.heartbeat)
	case c.startTimeout <= 0:
		return c, fmt.Errorf("start timeout %v: want > 0", c.startTimeout)
	}
	return c, nil
}

// Client settings for NewEtcdClient. gRPC does not ping more often than
// every 10 s whatever is asked.
const (
	clientDialTimeout      = 2 * time.Second
	clientKeepAliveTime    = 10 * time.Second
	clientKeepAliveTimeout = 2 * time.Second
	probeTimeout           = 500 * time.Millisecond
)

// Etcd is one etcd member running as a child process: a single-member
// cluster from [StartEtcd] or [LaunchEtcd], or a member of an
// [EtcdCluster]. Its name, data directory and ports stay the same across
// Kill/Stop and Restart.
type Etcd struct {
	name    string
	bin     string
	dataDir string
	logPath string
	cfg     etcdConfig
	cluster *EtcdCluster
	cert    Cert // server certificate (WithTLS)

	mu         sync.Mutex
	clientPort int
	peerPort   int
	proc       *process // nil before the first start
	started    bool     // has been ready once: restarts join as "existing"
}

// Name returns the member's name (m0, m1, ...).
func (e *Etcd) Name() string { return e.name }

// Endpoint returns the member's client address, "127.0.0.1:port".
func (e *Etcd) Endpoint() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return hostPort(e.clientPort)
}

// ClientURL returns the member's client URL, "http://127.0.0.1:port", or
// "https://127.0.0.1:port" with [WithTLS].
func (e *Etcd) ClientURL() string { return e.cluster.scheme() + e.Endpoint() }

// ServerCert returns the certificate the member serves its client URL with
// ([WithTLS]; the zero Cert without). Its files are the ones etcd reads.
func (e *Etcd) ServerCert() Cert {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cert
}

// RotateServerCert issues a new server certificate for the member from the
// same CA (a new key and serial number) and replaces the files etcd reads,
// each by an atomic rename. etcd reads them on every new TLS handshake:
// connections open before keep the old certificate, new ones get the new
// one, with no restart. It fails without [WithTLS].
func (e *Etcd) RotateServerCert() (Cert, error) {
	pki := e.cfg.pki
	if pki == nil {
		return Cert{}, errors.New("testenv: RotateServerCert: etcd started without WithTLS")
	}
	c, err := pki.Issue(e.certName())
	if err != nil {
		return Cert{}, err
	}
	e.mu.Lock()
	e.cert = c
	e.mu.Unlock()
	return c, nil
}

// certName names the member's server certificate files in the PKI's
// directory (shared by every cluster of a PKI).
func (e *Etcd) certName() string { return e.cluster.token + "-" + e.name }

// ClientConfig returns the configuration of [Etcd.Client]: [EtcdClientConfig]
// for this member, with the admin certificate and root's credentials when
// the cluster runs with [WithTLS] and [WithAuth].
func (e *Etcd) ClientConfig() clientv3.Config { return e.cluster.clientConfig(e.Endpoint()) }

// PeerURL returns the member's peer URL, "http://127.0.0.1:port".
func (e *Etcd) PeerURL() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return "http://" + hostPort(e.peerPort)
}

// DataDir returns the member's data directory (inside the test's temp dir).
func (e *Etcd) DataDir() string { return e.dataDir }

// LogPath returns the file that receives the member's stdout and stderr,
// across restarts.
func (e *Etcd) LogPath() string { return e.logPath }

// PID returns the process id of the member's current or last process.
func (e *Etcd) PID() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.proc == nil {
		return 0
	}
	return e.proc.pid()
}

// Running reports whether the member's process is alive (possibly paused).
func (e *Etcd) Running() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.proc != nil && !e.proc.exited()
}

// Client returns a new client for this member only, closed when t ends
// (configured by [Etcd.ClientConfig]).
func (e *Etcd) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	return NewEtcdClientWith(t, e.ClientConfig())
}

// Kill sends SIGKILL and waits (at most 10 s) for the process to exit. It
// does nothing if the member is not running.
func (e *Etcd) Kill() {
	if p := e.current(); p != nil {
		_ = p.kill()
	}
}

// Stop sends SIGTERM, waits up to 3 s for a graceful exit, then kills. It
// does nothing if the member is not running. A member whose peers are still
// running takes about a second to stop gracefully (it waits for their
// connections to close).
func (e *Etcd) Stop() {
	if p := e.current(); p != nil {
		_ = p.stop(stopGrace)
	}
}

// Close stops the member (SIGTERM, then SIGKILL after 1 s) and waits for
// its process to exit. It is how the caller of [LaunchEtcd] stops it;
// members from [StartEtcd] and [StartEtcdCluster] are stopped when their
// test ends. It does nothing if the member is not running, and fails only
// if the process could not be reaped. It does not remove the data
// directory.
func (e *Etcd) Close() error {
	if p := e.current(); p != nil {
		if err := p.stop(cleanupGrace); err != nil {
			return fmt.Errorf("testenv: stop etcd %s: %w", e.name, err)
		}
	}
	return nil
}

// Pause sends SIGSTOP and waits (at most 1 s) until the process is stopped:
// it keeps its sockets but answers nothing, like a long GC pause or a frozen
// VM. It does nothing if the member is not running.
func (e *Etcd) Pause() {
	if p := e.current(); p != nil {
		p.pause()
	}
}

// Resume sends SIGCONT to a paused member and waits (at most 1 s) until it
// runs again.
func (e *Etcd) Resume() {
	if p := e.current(); p != nil {
		p.resume()
	}
}

func (e *Etcd) current() *process {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.proc
}

// Restart starts the member again with the same name, data directory and
// ports, first stopping it (as Stop) if it is still running. It waits until
// the member listens on its ports; then, if a quorum of its cluster's
// members is running (always true for a single member), until the member is
// ready (/readyz: it knows a leader and serves linearizable reads). Without a
// quorum it cannot become ready, so it returns early; call WaitReady once
// enough members run. Paused members count as running. The test fails if
// the member exits or does not get there within the start timeout.
func (e *Etcd) Restart(t testing.TB) {
	t.Helper()
	start := time.Now()
	ready, err := e.restart(context.Background())
	if err != nil {
		t.Fatalf("%v", err)
	}
	if !ready {
		t.Logf("testenv: etcd %s restarted (listening, no quorum running) in %v", e.name, time.Since(start).Round(time.Millisecond))
		return
	}
	t.Logf("testenv: etcd %s restarted and ready in %v", e.name, time.Since(start).Round(time.Millisecond))
}

// RestartContext is [Etcd.Restart] for programs that are not tests: it
// returns an error instead of failing a test, and ctx bounds it too.
func (e *Etcd) RestartContext(ctx context.Context) error {
	_, err := e.restart(ctx)
	return err
}

// restart does Restart's work and reports whether it waited for readiness
// (a quorum was running).
func (e *Etcd) restart(ctx context.Context) (ready bool, err error) {
	if p := e.current(); p != nil {
		if err := p.stop(stopGrace); err != nil {
			return false, fmt.Errorf("testenv: restart etcd %s: %w", e.name, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.startTimeout)
	defer cancel()
	if err := e.launch(); err != nil {
		return false, fmt.Errorf("testenv: restart etcd %s: %w", e.name, err)
	}
	if err := e.waitListening(ctx); err != nil {
		return false, fmt.Errorf("testenv: restart etcd %s: %w\n%s log tail:\n%s", e.name, err, e.name, logTail(e.logPath))
	}
	if !e.cluster.quorumRunning() {
		return false, nil
	}
	if err := e.waitReady(ctx); err != nil {
		return false, fmt.Errorf("testenv: restart etcd %s: %w\n%s log tail:\n%s", e.name, err, e.name, logTail(e.logPath))
	}
	return true, nil
}

// WaitReady waits until the member answers /readyz (it knows a leader and
// serves linearizable reads), failing the test after the start timeout or as
// soon as the process exits.
func (e *Etcd) WaitReady(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.startTimeout)
	defer cancel()
	if err := e.waitReady(ctx); err != nil {
		t.Fatalf("testenv: etcd %s: %v\n%s log tail:\n%s", e.name, err, e.name, logTail(e.logPath))
	}
}

// launch starts a process for the member. The previous process, if any,
// must have exited.
func (e *Etcd) launch() error {
	initialCluster := e.cluster.initialCluster() // locks every member
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.proc != nil && !e.proc.exited() {
		return fmt.Errorf("previous process %d still running", e.proc.pid())
	}
	state := "new"
	if e.started {
		state = "existing"
	}
	scheme := e.cluster.scheme()
	args := []string{
		"--name", e.name,
		"--data-dir", e.dataDir,
		"--listen-client-urls", scheme + hostPort(e.clientPort),
		"--advertise-client-urls", scheme + hostPort(e.clientPort),
		"--listen-peer-urls", "http://" + hostPort(e.peerPort),
		"--initial-advertise-peer-urls", "http://" + hostPort(e.peerPort),
		"--initial-cluster", initialCluster,
		"--initial-cluster-state", state,
		"--initial-cluster-token", e.cluster.token,
		"--heartbeat-interval", strconv.FormatInt(e.cfg.heartbeat.Milliseconds(), 10),
		"--election-timeout", strconv.FormatInt(e.cfg.election.Milliseconds(), 10),
		"--log-level", e.cfg.logLevel,
	}
	if e.cfg.pki != nil {
		args = append(args, "--cert-file", e.cert.CertFile, "--key-file", e.cert.KeyFile,
			"--trusted-ca-file", e.cfg.pki.CAFile(), "--client-cert-auth")
	}
	if e.cfg.auth {
		args = append(args, "--bcrypt-cost", "4")
	}
	args = append(args, e.cfg.extraArgs...)
	p, err := startProcess(e.bin, args, e.logPath, "ETCD_", "ETCDCTL_")
	if err != nil {
		return err
	}
	e.proc = p
	return nil
}

// waitListening waits until the member's client port accepts connections.
// etcd binds its listeners before it needs a quorum.
func (e *Etcd) waitListening(ctx context.Context) error {
	p, addr := e.current(), e.Endpoint()
	if p == nil {
		return errNotStarted
	}
	var d net.Dialer
	return poll(ctx, p, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// waitReady waits until GET /readyz answers 200.
func (e *Etcd) waitReady(ctx context.Context) error {
	p, url := e.current(), e.ClientURL()+"/readyz"
	if p == nil {
		return errNotStarted
	}
	probe := e.cluster.probe
	return poll(ctx, p, func(ctx context.Context) error { return httpOK(ctx, probe, url) })
}

// poll calls probe until it succeeds, ctx ends or p exits.
func poll(ctx context.Context, p *process, probe func(context.Context) error) error {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		err := probe(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return p.exitError()
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w (last probe: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// newProbeClient returns a client that makes one connection per probe (no
// keep-alive), so probing leaves no idle connections or goroutines behind;
// tlsCfg (nil: none) is for members serving TLS.
func newProbeClient(tlsCfg *tls.Config) *http.Client {
	return &http.Client{
		Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil, TLSClientConfig: tlsCfg},
		Timeout:   probeTimeout,
	}
}

// plainProbe probes plaintext HTTP endpoints.
var plainProbe = newProbeClient(nil)

func httpOK(ctx context.Context, probeClient *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// EtcdClientConfig returns the client configuration NewEtcdClient uses:
// 2 s dial timeout, keep-alive pings every 10 s with a 2 s timeout, no
// logging. Tests that need other settings can start from it.
func EtcdClientConfig(endpoints ...string) clientv3.Config {
	return clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          clientDialTimeout,
		DialKeepAliveTime:    clientKeepAliveTime,
		DialKeepAliveTimeout: clientKeepAliveTimeout,
		Logger:               zap.NewNop(),
	}
}

// NewEtcdClientWith returns a new etcd client with cfg, closed when t
// ends.
func NewEtcdClientWith(t testing.TB, cfg clientv3.Config) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("testenv: etcd client for %v: %v", cfg.Endpoints, err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// NewEtcdClient returns a new etcd client for the endpoints (host:port or
// URLs, for instance a toxiproxy [Proxy.Addr]) with [EtcdClientConfig],
// closed when t ends. Creating a client does not wait for a connection.
func NewEtcdClient(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(EtcdClientConfig(endpoints...))
	if err != nil {
		t.Fatalf("testenv: etcd client for %v: %v", endpoints, err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// StartEtcd starts a single-member etcd cluster and waits until it is ready
// (/readyz). It is stopped when t ends. It is StartEtcdCluster(t, 1, opts...)
// returning the only member.
func StartEtcd(t testing.TB, opts ...EtcdOption) *Etcd {
	t.Helper()
	return StartEtcdCluster(t, 1, opts...).members[0]
}

// LaunchEtcd starts a single-member etcd on loopback, with its data
// directory and log in dir (created if missing), and waits until it is
// ready (/readyz), bounded by ctx and the start timeout. It is [StartEtcd]
// for programs that are not tests: nothing is tied to a testing.TB, the
// caller stops the member with [Etcd.Close] and owns dir. Start-up is
// retried with fresh ports if another process took one of them. A missing
// binary gives [BinaryPath]'s error; a member that does not get ready, an
// error with the tail of its log.
func LaunchEtcd(ctx context.Context, dir string, opts ...EtcdOption) (*Etcd, error) {
	c, err := launchCluster(ctx, 1, dir, opts, nil)
	if err != nil {
		return nil, err
	}
	return c.members[0], nil
}

// LaunchEtcdTemp is [LaunchEtcd] with its data in a new temporary
// directory named after pattern ([os.MkdirTemp]), which it returns: the
// caller removes it after [Etcd.Close]. On an error nothing is left.
func LaunchEtcdTemp(ctx context.Context, pattern string, opts ...EtcdOption) (m *Etcd, dir string, err error) {
	dir, err = os.MkdirTemp("", pattern)
	if err != nil {
		return nil, "", err
	}
	m, err = LaunchEtcd(ctx, dir, opts...)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, "", err
	}
	return m, dir, nil
}
