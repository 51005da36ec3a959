package runner_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// Runners on an etcd with client TLS and authentication, each logged in as
// a user whose role is limited to its namespace's prefix (the etcdctl lines
// of SECURITY.md, run by testenv.AddPrefixUser).

var secureUsers atomic.Int64

// secureEtcd starts a one-member etcd with client TLS (a CA made for the
// test) and auth enabled.
func secureEtcd(t *testing.T) *testenv.Etcd {
	t.Helper()
	return testenv.StartEtcd(t, testenv.WithTLS(testenv.NewPKI(t, "runner-test")), testenv.WithAuth())
}

// namespaceUser creates a user (and its role) granted perm on prefix only
// and returns its name and password.
func namespaceUser(t *testing.T, srv *testenv.Etcd, prefix, perm string) (user, password string) {
	t.Helper()
	user = fmt.Sprintf("shardhost-%d", secureUsers.Add(1))
	password = "pw-" + user
	srv.Cluster().AddPrefixUser(t, user, password, prefix, perm)
	return user, password
}

// secureStore returns a store of namespace ns on srv logged in as user.
func secureStore(t *testing.T, srv *testenv.Etcd, ns, user, password string) *etcd.Store {
	t.Helper()
	cfg := srv.ClientConfig()
	cfg.Username, cfg.Password = user, password
	s, err := etcd.New(testenv.NewEtcdClientWith(t, cfg), ns, etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// runOn starts a runner on s; Cleanup closes it.
func runOn(t *testing.T, s storage.Store, rec *recorder, cfg runner.Config) *started {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = logger(t)
	}
	r, err := runner.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := &started{Runner: r, sub: r.Subscribe(), done: make(chan error, 1)}
	if rec != nil {
		rec.follow(st.sub)
	}
	go func() { st.done <- r.Run(context.Background()) }()
	waitRunning(t, r)
	t.Cleanup(func() {
		r.Close()
		<-st.done
		st.sub.Close()
	})
	return st
}

// TestRunnersWorkWithANamespaceRole: two hosting runners logged in as a
// user whose role grants readwrite on "/{namespace}/" only, and a
// client-only gateway whose role grants read on runners/, shards/,
// handoffs/, drains/ and the cluster record only, not checkpoints/
// (started first, it waits for a hosting runner to publish the cluster
// record), over client TLS:
// they register, own every shard, serve asks, and a graceful shutdown
// hands off and revokes its lease (etcd checks write permission on every
// key attached to a lease it revokes), without a detach.
func TestRunnersWorkWithANamespaceRole(t *testing.T) {
	t.Parallel()
	srv := secureEtcd(t)
	const ns, shards = "secure", 32
	user, pw := namespaceUser(t, srv, "/"+ns+"/", "readwrite")
	// The gateway's role: read on what a client-only runner reads, not on
	// checkpoints/ (the entities' state).
	reader, readerPw := "gateway", "pw-gateway"
	srv.Cluster().AddGatewayUser(t, reader, readerPw, ns)
	k := newTestKind(false)
	rec := newRecorder(t)
	// The gateway first: it may not write the cluster record, and waits
	// for a hosting runner to publish it.
	gw := runOn(t, secureStore(t, srv, ns, reader, readerPw), nil, runner.Config{ID: "gw", NumShards: shards, ClientOnly: true})
	if err := gw.Register(k.kind); err != nil {
		t.Fatal(err)
	}
	var hosts []*started
	for _, id := range []string{"r1", "r2"} {
		h := runOn(t, secureStore(t, srv, ns, user, pw), rec, runner.Config{ID: id, NumShards: shards, ListenAddr: "127.0.0.1:0"})
		if err := h.Register(k.kind); err != nil {
			t.Fatal(err)
		}
		hosts = append(hosts, h)
	}
	select {
	case <-gw.Ready():
	case err := <-gw.done:
		t.Fatalf("the read-only gateway stopped: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the read-only gateway not ready 20 s after the hosting runners started")
	}
	waitFor(t, 20*time.Second, "both runners owning shards", func() bool {
		return len(hosts[0].Owned())+len(hosts[1].Owned()) == shards && len(hosts[0].Owned()) > 0 && len(hosts[1].Owned()) > 0
	})
	// Its role is enough for its readiness probes of the store too.
	waitFor(t, 20*time.Second, "the read-only gateway ready", func() bool { return gw.CheckReadiness().OK })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 20 {
		if _, err := k.inc.Ask(ctx, gw, fmt.Sprintf("e%d", i), incReq{By: 1}); err != nil {
			t.Fatalf("Ask through the gateway: %v", err)
		}
	}
	if err := hosts[0].Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with a namespace role: %v", err)
	}
	waitFor(t, 20*time.Second, "r2 owning every shard", func() bool { return len(hosts[1].Owned()) == shards })
	for i := range 20 {
		if n, err := k.inc.Ask(ctx, gw, fmt.Sprintf("e%d", i), incReq{By: 1}); err != nil || n < 1 {
			t.Fatalf("Ask after the shutdown = %d, %v", n, err)
		}
	}
	if d := detachedEvents(rec.all()); len(d) > 0 {
		t.Errorf("runners detached: %+v", d)
	}
}

// TestStartRefusedIsPermissionDenied: a runner whose user may not do what
// a runner does stops at once: Run returns an error matching
// storage.ErrPermissionDenied (and logs it at ERROR) instead of retrying
// forever.
func TestStartRefusedIsPermissionDenied(t *testing.T) {
	srv := secureEtcd(t)
	for _, tc := range []struct {
		name       string
		prefix     string
		perm       string
		clientOnly bool
		spoil      func(t *testing.T, user string) // after the client logged in
	}{
		{name: "read-only role, hosting", prefix: "/denied/", perm: "read"},
		{name: "role of another prefix, hosting", prefix: "/elsewhere/", perm: "readwrite"},
		{name: "role of another prefix, client-only", prefix: "/elsewhere/", perm: "readwrite", clientOnly: true},
		{name: "password changed after the client logged in", prefix: "/denied/", perm: "readwrite", spoil: func(t *testing.T, user string) {
			if _, err := srv.Client(t).UserChangePassword(context.Background(), user, "changed"); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user, pw := namespaceUser(t, srv, tc.prefix, tc.perm)
			s := secureStore(t, srv, "denied", user, pw)
			if tc.spoil != nil {
				tc.spoil(t, user)
			}
			var lc logCapture
			r, err := runner.New(s, runner.Config{ID: "r1", NumShards: 8, ClientOnly: tc.clientOnly, Logger: lc.logger(t)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err = r.Run(ctx)
			if !errors.Is(err, storage.ErrPermissionDenied) {
				t.Fatalf("Run = %v, want storage.ErrPermissionDenied", err)
			}
			t.Logf("Run: %v", err)
			if got := lc.find(slog.LevelError, "refused this runner's credentials or permissions"); len(got) != 1 {
				t.Errorf("ERROR lines about the refusal: %v, want 1", got)
			}
		})
	}
}

// permissionRun is a runner owning 8 shards on an etcd with auth, logged
// in as a user whose role grants readwrite on its namespace only, with its
// logs, events and metrics recorded.
type permissionRun struct {
	srv       *testenv.Etcd
	user, ns  string
	r         *started
	lc        logCapture
	rec       recorder
	rd        *sdkmetric.ManualReader
	ttl       time.Duration
	revokedAt time.Time
}

func startPermissionRun(t *testing.T, ns string) *permissionRun {
	t.Helper()
	p := &permissionRun{srv: secureEtcd(t), ns: ns, rd: sdkmetric.NewManualReader(), ttl: 3 * time.Second}
	var pw string
	p.user, pw = namespaceUser(t, p.srv, "/"+ns+"/", "readwrite")
	p.r = runOn(t, secureStore(t, p.srv, ns, p.user, pw), &p.rec, runner.Config{
		ID: "r1", NumShards: 8, LeaseTTL: p.ttl, Logger: p.lc.logger(t),
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(p.rd)),
	})
	waitFor(t, 10*time.Second, "owning every shard", func() bool { return len(p.r.Owned()) == 8 })
	return p
}

// revoke takes every permission from the role, then grants it keep
// ("read", or "" for nothing), and waits for the runner to detach.
func (p *permissionRun) revoke(t *testing.T, keep string) {
	t.Helper()
	p.srv.Cluster().MustEtcdctl(t, "role", "revoke-permission", p.user, "/"+p.ns+"/", "--prefix")
	if keep != "" {
		p.srv.Cluster().MustEtcdctl(t, "role", "grant-permission", p.user, keep, "/"+p.ns+"/", "--prefix")
	}
	p.revokedAt = time.Now()
	d := waitDetached(t, &p.rec, 2*p.ttl)
	t.Logf("detached %v after the revocation (kept: %q): %s (%s)", d.Time.Sub(p.revokedAt).Round(time.Millisecond), keep, d.Reason, d.Detail)
}

// restore grants readwrite again and waits for the runner to own its
// shards again, after a Reattached event, and to log the refusal at ERROR
// once in all (then once a minute).
func (p *permissionRun) restore(t *testing.T) {
	t.Helper()
	if got := p.lc.find(slog.LevelError, refusedWhileDetached); len(got) != 1 {
		t.Errorf("ERROR lines about the refusal: %d, want 1 (then once a minute)", len(got))
	}
	if !p.r.Status().Detached {
		t.Errorf("status %+v, want detached", p.r.Status())
	}
	p.srv.Cluster().MustEtcdctl(t, "role", "grant-permission", p.user, "readwrite", "/"+p.ns+"/", "--prefix")
	waitFor(t, 5*p.ttl, "owning every shard again", func() bool { return len(p.r.Owned()) == 8 })
	reattached := false
	for _, ev := range p.rec.all() {
		_, ok := ev.(runner.Reattached)
		reattached = reattached || ok
	}
	if !reattached {
		t.Error("owning its shards again without a Reattached event")
	}
}

// TestPermissionLostWhileRunning: the role loses its write permission
// while the runner owns shards. Renewals are refused, the runner detaches
// before its lease's deadline (logged, counted), and then stays detached
// without spinning: a re-attach attempt per RecoverWindow of health,
// logged at ERROR once, each counted in sharding.storage_errors with
// error.type=permission_denied. When the permission comes back it
// re-attaches and owns its shards again.
func TestPermissionLostWhileRunning(t *testing.T) {
	t.Parallel()
	p := startPermissionRun(t, "lost")
	p.revoke(t, "read")

	// Detached, refused: measure what the process spends for a while.
	var before, after syscall.Rusage
	const window = 6 * time.Second
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	time.Sleep(window)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	refused := deniedErrors(t, p.rd)
	t.Logf("detached and refused for %v: %v of CPU for the whole test process (%.1f%% of a core), %d refused store calls counted",
		window, cpu.Round(time.Millisecond), 100*cpu.Seconds()/window.Seconds(), refused)
	// One re-attach per RecoverWindow (TTL/3) of health, plus the calls
	// of the detach itself: a loop would make thousands.
	if limit := int64(window/(p.ttl/3)) + 10; refused == 0 || refused > limit {
		t.Errorf("%d refused store calls counted in %v, want 1..%d", refused, window, limit)
	}
	if got := p.lc.find(slog.LevelDebug, refusedWhileDetached, "call", "re-attach"); len(got) == 0 {
		t.Errorf("no refused re-attach recorded (DEBUG) while the role could still read")
	}
	p.restore(t)
}

// refusedWhileDetached is the message of a detached runner's refused
// calls (ERROR once a minute, DEBUG between).
const refusedWhileDetached = "the store denies this runner's credentials or permissions; staying detached"

// TestPermissionRevokedEntirelyIsLoud: the role loses every permission,
// read included, while the runner owns shards. It detaches, and then each
// of its probes — renewals while its lease lives, reads once it is gone —
// is refused: logged at ERROR at once (then once a minute) and counted in
// sharding.storage_errors with error.type=permission_denied, not silently
// retried. When the permission comes back it re-attaches and owns its
// shards again.
func TestPermissionRevokedEntirelyIsLoud(t *testing.T) {
	t.Parallel()
	p := startPermissionRun(t, "revoked")
	p.revoke(t, "")
	waitFor(t, 2*p.ttl, "an ERROR about the refusal", func() bool { return len(p.lc.find(slog.LevelError, refusedWhileDetached)) > 0 })
	t.Logf("ERROR %v after the revocation: %v", time.Since(p.revokedAt).Round(time.Millisecond), p.lc.find(slog.LevelError, refusedWhileDetached)[0])
	// Past the lease's life: the probes are reads then, refused as well.
	time.Sleep(2 * p.ttl)
	if n := deniedErrors(t, p.rd); n < 2 {
		t.Errorf("%d refused calls counted in sharding.storage_errors{error.type=permission_denied} %v after the revocation, want one per probe",
			n, time.Since(p.revokedAt).Round(time.Second))
	} else {
		t.Logf("%d refused calls counted %v after the revocation", n, time.Since(p.revokedAt).Round(time.Second))
	}
	p.restore(t)
}

// deniedErrors returns sharding.storage_errors with
// error.type=permission_denied.
func deniedErrors(t *testing.T, rd *sdkmetric.ManualReader) int64 {
	t.Helper()
	var n int64
	for _, p := range int64Points(t, rd, "sharding.storage_errors") {
		if v, _ := p.Attributes.Value(attribute.Key("error.type")); v.AsString() == "permission_denied" {
			n += p.Value
		}
	}
	return n
}

// TestEtcdCertRotationKeepsRunnersAttached: each member of a 3-member
// etcd cluster gets a new server certificate from the same CA (its files
// replaced; etcd reads them on every new TLS handshake) and restarts
// (SIGKILL, then started again), one after the other, so that every connection handshakes again with a new
// certificate: a rolling rotation. The runners, whose renewals are hedged
// across the members, keep every shard without a detach.
func TestEtcdCertRotationKeepsRunnersAttached(t *testing.T) {
	t.Parallel()
	pki := testenv.NewPKI(t, "runner-test")
	ec := testenv.StartEtcdCluster(t, 3, testenv.WithTLS(pki), testenv.WithAuth())
	const ns, shards = "rotate", 16
	ec.AddPrefixUser(t, "rotate", "pw-rotate", "/"+ns+"/", "readwrite")
	k := newTestKind(false)
	rec := newRecorder(t)
	var hosts []*started
	for _, id := range []string{"r1", "r2"} {
		cfg := ec.ClientConfig()
		cfg.Username, cfg.Password = "rotate", "pw-rotate"
		s, err := etcd.New(testenv.NewEtcdClientWith(t, cfg), ns, etcd.Config{})
		if err != nil {
			t.Fatal(err)
		}
		h := runOn(t, s, rec, runner.Config{ID: id, NumShards: shards, ListenAddr: "127.0.0.1:0"})
		if err := h.Register(k.kind); err != nil {
			t.Fatal(err)
		}
		hosts = append(hosts, h)
	}
	owned := func() bool {
		return len(hosts[0].Owned())+len(hosts[1].Owned()) == shards && len(hosts[0].Owned()) > 0 && len(hosts[1].Owned()) > 0
	}
	waitFor(t, 20*time.Second, "both runners owning shards", owned)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Followers first; the leader hands its leadership over before its
	// turn, as a rolling restart does (killing a leader costs an
	// election, which is not what this test is about).
	start := time.Now()
	first := ec.Leader(t)
	var order []*testenv.Etcd
	for _, m := range ec.Members() {
		if m != first {
			order = append(order, m)
		}
	}
	for _, m := range append(order, first) {
		if leader := ec.Leader(t); leader == m {
			moveLeader(t, ec, m, order[0])
		}
		old := m.ServerCert().Leaf.SerialNumber
		c, err := m.RotateServerCert()
		if err != nil {
			t.Fatal(err)
		}
		// Killed, not stopped: a graceful stop of a member with clients
		// connected runs into testenv's 3 s bound anyway, and what is
		// tested is the new process's handshakes.
		m.Kill()
		m.Restart(t)
		conn, err := tls.Dial("tcp", m.Endpoint(), pki.ClientTLS(ec.AdminCert()))
		if err != nil {
			t.Fatal(err)
		}
		served := conn.ConnectionState().PeerCertificates[0].SerialNumber
		conn.Close()
		if served.Cmp(c.Leaf.SerialNumber) != 0 || served.Cmp(old) == 0 {
			t.Fatalf("%s serves certificate %v, want the new %v (old %v)", m.Name(), served, c.Leaf.SerialNumber, old)
		}
		for _, h := range hosts {
			if _, err := k.inc.Ask(ctx, h, "rotating", incReq{By: 1}); err != nil {
				t.Fatalf("Ask through %s after %s restarted: %v", h.ID(), m.Name(), err)
			}
		}
	}
	// A TTL more: a runner cut off by a restart would have detached.
	time.Sleep(runner.DefaultLeaseTTL)
	if d := detachedEvents(rec.all()); len(d) > 0 {
		t.Fatalf("runners detached during the rotation: %+v", d)
	}
	if !owned() {
		t.Fatalf("shards owned after the rotation: %d + %d, want %d", len(hosts[0].Owned()), len(hosts[1].Owned()), shards)
	}
	t.Logf("every member restarted with a new certificate in %v; no detach", time.Since(start).Round(time.Millisecond))
}

// moveLeader makes member to the leader of ec instead of from.
func moveLeader(t *testing.T, ec *testenv.EtcdCluster, from, to *testenv.Etcd) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli := from.Client(t)
	ms, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms.Members {
		if m.Name == to.Name() {
			if _, err := cli.MoveLeader(ctx, m.ID); err != nil {
				t.Fatalf("move the leadership from %s to %s: %v", from.Name(), to.Name(), err)
			}
			if got := ec.Leader(t); got != to {
				t.Fatalf("leader %s after moving it to %s", got.Name(), to.Name())
			}
			return
		}
	}
	t.Fatalf("no member %s in %v", to.Name(), ms.Members)
}
