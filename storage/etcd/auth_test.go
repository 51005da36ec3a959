package etcd_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
	"github.com/shardhost/shardhost/storage/storagetest"
)

// One etcd with client TLS and auth for the tests of this file.
var (
	secureOnce sync.Once
	secureSrv  *testenv.Etcd
	secureDir  string
	secureErr  error
)

// secureEtcd returns the package's etcd with TLS and auth, started on first
// use (not tied to one test, so that the tests of this file share it) and
// stopped by TestMain (stopSecureEtcd).
func secureEtcd(t *testing.T) *testenv.Etcd {
	t.Helper()
	testenv.SkipIfShort(t, "starts etcd")
	secureOnce.Do(func() {
		dir, err := os.MkdirTemp("", "shardhost-etcd-secure-")
		if err != nil {
			secureErr = err
			return
		}
		secureDir = dir
		pki, err := testenv.NewPKIDir(dir+"/pki", "storage-etcd-test")
		if err != nil {
			secureErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		secureSrv, secureErr = testenv.LaunchEtcd(ctx, dir, testenv.WithTLS(pki), testenv.WithAuth())
	})
	if secureErr != nil {
		t.Fatalf("etcd with TLS and auth: %v", secureErr)
	}
	return secureSrv
}

// stopSecureEtcd stops the shared etcd, if it was started, and removes
// its directory.
func stopSecureEtcd() error {
	var err error
	if secureSrv != nil {
		err = secureSrv.Close()
	}
	if secureDir != "" {
		err = errors.Join(err, os.RemoveAll(secureDir))
	}
	return err
}

// userClient returns a client of srv logged in as a new user whose role
// grants perm on prefix only (testenv.AddPrefixUser: the etcdctl lines of
// SECURITY.md).
func userClient(t *testing.T, srv *testenv.Etcd, prefix, perm string) *clientv3.Client {
	t.Helper()
	user := fmt.Sprintf("u%d", nextUser())
	srv.Cluster().AddPrefixUser(t, user, "pw-"+user, prefix, perm)
	cfg := srv.ClientConfig()
	cfg.Username, cfg.Password = user, "pw-"+user
	return testenv.NewEtcdClientWith(t, cfg)
}

// apiUserClient is userClient with a readwrite role made through the
// client's Auth API (four calls instead of four etcdctl processes).
func apiUserClient(t *testing.T, srv *testenv.Etcd, root *clientv3.Client, prefix string) *clientv3.Client {
	t.Helper()
	user := fmt.Sprintf("u%d", nextUser())
	ctx := ctx5(t)
	_, err := root.RoleAdd(ctx, user)
	if err == nil {
		_, err = root.RoleGrantPermission(ctx, user, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
	}
	if err == nil {
		_, err = root.UserAdd(ctx, user, "pw-"+user)
	}
	if err == nil {
		_, err = root.UserGrantRole(ctx, user, user)
	}
	if err != nil {
		t.Fatalf("user %s with readwrite on %s: %v", user, prefix, err)
	}
	cfg := srv.ClientConfig()
	cfg.Username, cfg.Password = user, "pw-"+user
	return testenv.NewEtcdClientWith(t, cfg)
}

var users struct {
	sync.Mutex
	n int
}

func nextUser() int {
	users.Lock()
	defer users.Unlock()
	users.n++
	return users.n
}

// TestConformanceWithNamespaceRole: every call of the store works for a
// user whose role grants readwrite on "/{namespace}/" and nothing else —
// leases included — over client TLS. Other writers and compaction use
// root.
func TestConformanceWithNamespaceRole(t *testing.T) {
	srv := secureEtcd(t)
	root := srv.Client(t)
	storagetest.Run(t, storagetest.Harness{New: func(t *testing.T) storagetest.Instance {
		ns := fmt.Sprintf("secure-%d", namespaces.Add(1))
		prefix := "/" + ns + "/"
		s, err := etcd.New(apiUserClient(t, srv, root, prefix), ns, etcd.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return storagetest.Instance{
			Store: s,
			RawPut: func(ctx context.Context, key string, value []byte, lease storage.LeaseID) error {
				_, err := root.Put(ctx, prefix+key, string(value), clientv3.WithLease(clientv3.LeaseID(lease)))
				return err
			},
			RawRevision: func(ctx context.Context, key string) (storage.Revision, bool, error) {
				resp, err := root.Get(ctx, prefix+key)
				if err != nil || len(resp.Kvs) == 0 {
					return 0, false, err
				}
				return storage.Revision(resp.Kvs[0].ModRevision), true, nil
			},
			RawDelete: func(ctx context.Context, key string) error {
				_, err := root.Delete(ctx, prefix+key)
				return err
			},
			Compact: func(ctx context.Context, rev storage.Revision) error {
				_, err := root.Compact(ctx, int64(rev), clientv3.WithCompactPhysical())
				return err
			},
		}
	}})
}

func ctx5(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantDenied(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, storage.ErrPermissionDenied) {
		t.Errorf("%s = %v, want storage.ErrPermissionDenied", what, err)
	} else {
		t.Logf("%s: %v", what, err)
	}
}

// TestMissingPermissionIsPermissionDenied: what each misconfiguration of
// the role does to the store's calls: every refusal is
// storage.ErrPermissionDenied, never ErrUnavailable (which would be
// retried as if etcd were down).
func TestMissingPermissionIsPermissionDenied(t *testing.T) {
	srv := secureEtcd(t)
	rec := storage.RunnerRecord{ID: "r1", Address: "127.0.0.1:1", Weight: 1, Incarnation: "i1"}

	t.Run("read-only role", func(t *testing.T) {
		s, err := etcd.New(userClient(t, srv, "/ro/", "read"), "ro", etcd.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.List(ctx5(t), storage.KeyspaceRunners); err != nil {
			t.Errorf("List with a read role = %v", err)
		}
		// A lease needs no key permission; attaching a key to it does.
		l, err := s.Grant(ctx5(t), 5*time.Second)
		if err != nil {
			t.Fatalf("Grant with a read role = %v", err)
		}
		_, err = s.PutRunner(ctx5(t), l.ID, rec)
		wantDenied(t, "PutRunner with a read role", err)
		_, err = s.Acquire(ctx5(t), l.ID, storage.Owner{RunnerID: rec.ID, Incarnation: rec.Incarnation}, []sharding.ShardID{1})
		wantDenied(t, "Acquire with a read role", err)
	})

	t.Run("another namespace's role", func(t *testing.T) {
		s, err := etcd.New(userClient(t, srv, "/other/", "readwrite"), "mine", etcd.Config{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.List(ctx5(t), storage.KeyspaceRunners)
		wantDenied(t, "List outside the role's prefix", err)
		wctx, cancel := context.WithCancel(ctx5(t))
		defer cancel()
		select {
		case wr := <-s.Watch(wctx, storage.KeyspaceShards, 1):
			wantDenied(t, "Watch outside the role's prefix", wr.Err)
		case <-wctx.Done():
			t.Error("Watch outside the role's prefix: no answer (a silent stall)")
		}
		wantDenied(t, "Ping outside the role's prefix", s.Ping(ctx5(t)))
	})

	t.Run("prefix without its trailing slash", func(t *testing.T) {
		// "/ns" without the slash grants "/ns/" too (and "/ns2/...": the
		// reason SECURITY.md gives the prefix with both slashes).
		s, err := etcd.New(userClient(t, srv, "/noslash", "readwrite"), "noslash2", etcd.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.List(ctx5(t), storage.KeyspaceRunners); err != nil {
			t.Errorf("List of /noslash2/ with a role on the prefix /noslash = %v, want it granted", err)
		}
	})

	t.Run("lease with a key the user may not write", func(t *testing.T) {
		// etcd checks keep-alive and revoke against the keys attached to
		// the lease: a user must hold write permission on all of them.
		cli := userClient(t, srv, "/lk/", "readwrite")
		s, err := etcd.New(cli, "lk", etcd.Config{})
		if err != nil {
			t.Fatal(err)
		}
		l, err := s.Grant(ctx5(t), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.KeepAliveOnce(ctx5(t), l.ID); err != nil {
			t.Fatalf("KeepAliveOnce of a lease without keys = %v", err)
		}
		root := srv.Client(t)
		if _, err := root.Put(ctx5(t), "/elsewhere/k", "v", clientv3.WithLease(clientv3.LeaseID(l.ID))); err != nil {
			t.Fatal(err)
		}
		_, err = s.KeepAliveOnce(ctx5(t), l.ID)
		wantDenied(t, "KeepAliveOnce of a lease holding a key outside the role", err)
		// (TimeToLive without the keys checks nothing.)
		if _, err := s.LeaseTimeToLive(ctx5(t), l.ID); err != nil {
			t.Errorf("LeaseTimeToLive of a lease holding a key outside the role = %v, want it answered", err)
		}
		wantDenied(t, "Revoke of a lease holding a key outside the role", s.Revoke(ctx5(t), l.ID))
	})

	t.Run("password changed", func(t *testing.T) {
		cli := userClient(t, srv, "/pw/", "readwrite")
		s, err := etcd.New(cli, "pw", etcd.Config{})
		if err != nil {
			t.Fatal(err)
		}
		l, err := s.Grant(ctx5(t), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Client(t).UserChangePassword(ctx5(t), cli.Username, "changed"); err != nil {
			t.Fatal(err)
		}
		// Changing a password revokes the user's tokens: the next call
		// logs in again, with the old password.
		_, err = s.KeepAliveOnce(ctx5(t), l.ID)
		wantDenied(t, "KeepAliveOnce after the password changed", err)
		_, err = s.List(ctx5(t), storage.KeyspaceShards)
		wantDenied(t, "List after the password changed", err)
	})

	t.Run("role revoked while running", func(t *testing.T) {
		cli := userClient(t, srv, "/rv/", "readwrite")
		s, err := etcd.New(cli, "rv", etcd.Config{})
		if err != nil {
			t.Fatal(err)
		}
		l, err := s.Grant(ctx5(t), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutRunner(ctx5(t), l.ID, rec); err != nil {
			t.Fatal(err)
		}
		srv.Cluster().MustEtcdctl(t, "role", "revoke-permission", cli.Username, "/rv/", "--prefix")
		_, err = s.KeepAliveOnce(ctx5(t), l.ID)
		wantDenied(t, "KeepAliveOnce after the role lost its permission", err)
		wantDenied(t, "Verify after the role lost its permission", verifyErr(t, s, l.ID))
	})

	t.Run("no user", func(t *testing.T) {
		// A client certificate but no credentials: etcd takes the
		// certificate's common name (testenv-admin) as the user, and there
		// is no such user.
		cfg := srv.ClientConfig()
		cfg.Username, cfg.Password = "", ""
		cli := testenv.NewEtcdClientWith(t, cfg)
		s, err := etcd.New(cli, "nouser", etcd.Config{})
		if err != nil {
			t.Fatal(err)
		}
		// etcd checks no permission to grant a lease: any client that
		// passes the TLS check may.
		if _, err := s.Grant(ctx5(t), 5*time.Second); err != nil {
			t.Errorf("Grant without credentials = %v, want granted", err)
		}
		_, err = s.List(ctx5(t), storage.KeyspaceRunners)
		wantDenied(t, "List without credentials", err)
	})
}

func verifyErr(t *testing.T, s *etcd.Store, lease storage.LeaseID) error {
	_, err := s.Verify(ctx5(t), lease, []storage.Held{{Shard: 1, Epoch: 1}})
	return err
}

// TestTranslateErrorOfNew: a wrong password fails clientv3.New itself
// (the client logs in when it is made); TranslateError names it.
func TestTranslateErrorOfNew(t *testing.T) {
	srv := secureEtcd(t)
	cfg := srv.ClientConfig()
	cfg.Password = "wrong"
	_, err := clientv3.New(cfg)
	wantDenied(t, "clientv3.New with a wrong password, translated", etcd.TranslateError(err))
	if etcd.TranslateError(nil) != nil {
		t.Error("TranslateError(nil) != nil")
	}
}

// TestRenewalsDoNotLogInAgain: with a user and password, renewals reuse
// the member's keep-alive stream instead of opening one each time, which
// would make the client log in again (an Authenticate: a bcrypt check and
// a raft proposal on the server) per renewal. The raft index counts the
// logins; renewals themselves do not go through raft.
func TestRenewalsDoNotLogInAgain(t *testing.T) {
	srv := secureEtcd(t)
	cli := userClient(t, srv, "/renew/", "readwrite")
	s, err := etcd.New(cli, "renew", etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Grant(ctx5(t), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutRunner(ctx5(t), l.ID, storage.RunnerRecord{ID: "r1", Address: "127.0.0.1:1", Weight: 1, Incarnation: "i1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.KeepAliveOnce(ctx5(t), l.ID); err != nil { // opens the stream (one login)
		t.Fatal(err)
	}
	root := srv.Client(t)
	index := func() uint64 {
		t.Helper()
		st, err := root.Status(ctx5(t), srv.Endpoint())
		if err != nil {
			t.Fatal(err)
		}
		return st.RaftIndex
	}
	// Other tests' leases expire on the shared server (a raft proposal
	// each): wait for a quiet moment, and allow for a few.
	before := index()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(300 * time.Millisecond)
		now := index()
		if now == before {
			break
		}
		before = now
	}
	const renewals = 20
	for range renewals {
		if _, err := s.KeepAliveOnce(ctx5(t), l.ID); err != nil {
			t.Fatalf("KeepAliveOnce = %v", err)
		}
	}
	if after := index(); after-before >= renewals/2 {
		t.Errorf("raft index moved from %d to %d over %d renewals: renewals log in again", before, after, renewals)
	}
	// After the user's password changed (etcd revokes its tokens), the
	// next renewal opens a new stream, whose login fails: a permission
	// error, not a renewal on a stale stream.
	if _, err := root.UserChangePassword(ctx5(t), cli.Username, "changed"); err != nil {
		t.Fatal(err)
	}
	_, err = s.KeepAliveOnce(ctx5(t), l.ID)
	wantDenied(t, "KeepAliveOnce after the password changed", err)
}

// TestProbeTLS: what a TLS handshake finds, as ProbeTLS reports it.
func TestProbeTLS(t *testing.T) {
	secure := secureEtcd(t)
	plain := testenv.StartEtcd(t)
	good := secure.ClientConfig().TLS
	noCert := good.Clone()
	noCert.Certificates = nil
	ctx := ctx5(t)
	for _, tc := range []struct {
		name     string
		endpoint string
		cfg      *tls.Config
		mismatch bool
		ok       bool
	}{
		{"the right CA and certificate", secure.ClientURL(), good, false, true},
		{"no client certificate", secure.Endpoint(), noCert, false, false},
		{"no TLS to a TLS endpoint", secure.Endpoint(), nil, true, false},
		{"TLS to a plaintext endpoint", plain.Endpoint(), good, true, false},
		{"no TLS to a plaintext endpoint", plain.ClientURL(), nil, false, true},
	} {
		err := etcd.ProbeTLS(ctx, tc.endpoint, tc.cfg)
		t.Logf("%s: %v", tc.name, err)
		if (err == nil) != tc.ok || errors.Is(err, etcd.ErrTLSMismatch) != tc.mismatch {
			t.Errorf("%s: ProbeTLS = %v, want ok %v, mismatch %v", tc.name, err, tc.ok, tc.mismatch)
		}
	}
}

// TestLoginsBoundedWhileAMemberIsSlow: with a user and password, hedged
// renewals through a slow member (each reply 400 ms late, attempts every
// 50 ms) open at most one keep-alive stream (one login) per second through
// it; without the bound every attempt logged in, and on a starved etcd
// those logins kept it starved.
func TestLoginsBoundedWhileAMemberIsSlow(t *testing.T) {
	pc := testenv.StartProxiedEtcdCluster(t, 1, testenv.WithTLS(testenv.NewPKI(t, "slow")), testenv.WithAuth())
	pc.AddPrefixUser(t, "slow", "pw-slow", "/slow/", "readwrite")
	cfg := pc.ClientConfig()
	cfg.Endpoints = pc.ProxiedEndpoints()
	cfg.Username, cfg.Password = "slow", "pw-slow"
	s, err := etcd.New(testenv.NewEtcdClientWith(t, cfg), "slow", etcd.Config{AttemptTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Grant(ctx5(t), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.KeepAliveOnce(ctx5(t), l.ID); err != nil {
		t.Fatal(err)
	}
	root := pc.Client(t) // not proxied
	index := func() uint64 {
		t.Helper()
		st, err := root.Status(ctx5(t), pc.Members()[0].Endpoint())
		if err != nil {
			t.Fatal(err)
		}
		return st.RaftIndex
	}
	before := index()
	pc.Proxies()[0].Latency(t, 400*time.Millisecond)
	const window = 2 * time.Second
	start := time.Now()
	calls, ok := 0, 0
	for time.Since(start) < window {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if _, err := s.KeepAliveOnce(ctx, l.ID); err == nil {
			ok++
		}
		cancel()
		calls++
	}
	logins := index() - before
	t.Logf("%d renewals in %v through a member 400 ms slow (%d answered): %d raft entries (logins), stats %+v",
		calls, window, ok, logins, s.Stats())
	if limit := uint64(window/time.Second) + 3; logins > limit {
		t.Errorf("%d logins in %v, want at most %d (one per second per member)", logins, window, limit)
	}
}

// TestCertificateCommonNameAsUser: without a password, etcd takes the
// client certificate's common name as the user (--client-cert-auth): a
// store whose certificate names a user with a namespace role works, and
// never logs in (no Authenticate, no raft entry per stream).
func TestCertificateCommonNameAsUser(t *testing.T) {
	srv := secureEtcd(t)
	root := srv.Client(t)
	// The etcd is the package's (shared with -count runs): a user and a
	// namespace of this run's own.
	user := fmt.Sprintf("cn-runner-%d", nextUser())
	ns := fmt.Sprintf("cn-%d", namespaces.Add(1))
	ctx := ctx5(t)
	if _, err := root.RoleAdd(ctx, user); err != nil {
		t.Fatal(err)
	}
	if _, err := root.RoleGrantPermission(ctx, user, "/"+ns+"/", clientv3.GetPrefixRangeEnd("/"+ns+"/"), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatal(err)
	}
	if _, err := root.UserAddWithOptions(ctx, user, "", &clientv3.UserAddOptions{NoPassword: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := root.UserGrantRole(ctx, user, user); err != nil {
		t.Fatal(err)
	}
	pki := srv.Cluster().PKI()
	cfg := testenv.EtcdClientConfig(srv.Endpoint())
	cfg.TLS = pki.ClientTLS(pki.MustIssue(t, user))
	s, err := etcd.New(testenv.NewEtcdClientWith(t, cfg), ns, etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Grant(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutRunner(ctx, l.ID, storage.RunnerRecord{ID: "r1", Address: "127.0.0.1:1", Weight: 1, Incarnation: "i1"}); err != nil {
		t.Fatalf("PutRunner as the certificate's user: %v", err)
	}
	for range 3 {
		if _, err := s.KeepAliveOnce(ctx, l.ID); err != nil {
			t.Fatalf("KeepAliveOnce as the certificate's user: %v", err)
		}
	}
	if _, err := s.List(ctx, storage.KeyspaceRunners); err != nil {
		t.Fatalf("List as the certificate's user: %v", err)
	}
	other, err := etcd.New(testenv.NewEtcdClientWith(t, cfg), "other", etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = other.List(ctx, storage.KeyspaceRunners)
	wantDenied(t, "List of another namespace as the certificate's user", err)
}
