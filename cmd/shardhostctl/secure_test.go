package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/etcd"
)

// TestSecureEtcd: shardhostctl reaches an etcd with client TLS and
// authentication through etcdctl's flags (or their environment
// variables), as a user whose role is limited to the namespace's prefix;
// each misconfiguration gets an error that says what to check.
func TestSecureEtcd(t *testing.T) {
	pki := testenv.NewPKI(t, "ctl-test")
	srv := testenv.StartEtcd(t, testenv.WithTLS(pki), testenv.WithAuth())
	ec := srv.Cluster()
	ec.AddPrefixUser(t, "ctl-rw", "pw-rw", "/sec/", "readwrite")
	ec.AddPrefixUser(t, "ctl-ro", "pw-ro", "/sec/", "read")
	client := pki.MustIssue(t, "shardhostctl") // CN shardhostctl: no etcd user

	// A runner of namespace sec, logged in as ctl-rw.
	cfg := srv.ClientConfig()
	cfg.Username, cfg.Password = "ctl-rw", "pw-rw"
	store, err := etcd.New(testenv.NewEtcdClientWith(t, cfg), "sec", etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := runner.New(store, runner.Config{
		ID: "r1", NumShards: 8, LeaseTTL: 3 * time.Second,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Shutdown(ctx)
		<-done
	})
	waitFor(t, 15*time.Second, "r1 owning every shard", func() bool { return len(r.Owned()) == 8 })

	tlsFlags := []string{"-endpoints", srv.Endpoint(), "-shards", "8", "-timeout", "3s",
		"-cacert", pki.CAFile(), "-cert", client.CertFile, "-key", client.KeyFile}
	with := func(extra ...string) []string { return append(append([]string(nil), tlsFlags...), extra...) }

	// Flags.
	code, out, errOut := ctl(t, with("-user", "ctl-rw", "-password", "pw-rw", "-namespace", "sec", "status")...)
	if code != exitOK || !strings.Contains(out, "r1") || !strings.Contains(out, "8 of 8 owned") {
		t.Fatalf("status with TLS and user flags: exit %d\n%s%s", code, out, errOut)
	}
	// user:password, as etcdctl takes it.
	if code, out, errOut := ctl(t, with("-user", "ctl-ro:pw-ro", "-namespace", "sec", "status")...); code != exitOK {
		t.Errorf("status with -user user:password: exit %d\n%s%s", code, out, errOut)
	}
	// No CA, its verification skipped (tests only).
	if code, out, errOut := ctl(t, "-endpoints", srv.Endpoint(), "-shards", "8", "-insecure-skip-tls-verify",
		"-cert", client.CertFile, "-key", client.KeyFile, "-user", "ctl-ro:pw-ro", "-namespace", "sec", "status"); code != exitOK {
		t.Errorf("status with -insecure-skip-tls-verify: exit %d\n%s%s", code, out, errOut)
	}
	// The environment.
	t.Run("environment", func(t *testing.T) {
		t.Setenv(envEndpoints, srv.Endpoint())
		t.Setenv(envNamespace, "sec")
		t.Setenv(envShards, "8")
		t.Setenv(envCACert, pki.CAFile())
		t.Setenv(envCert, client.CertFile)
		t.Setenv(envKey, client.KeyFile)
		t.Setenv(envUser, "ctl-rw")
		t.Setenv(envPassword, "pw-rw")
		if code, out, errOut := ctl(t, "status"); code != exitOK || !strings.Contains(out, "r1") {
			t.Errorf("status configured by the environment: exit %d\n%s%s", code, out, errOut)
		}
	})

	// plan through the same flags, as the read-only user and without
	// -shards: the shard count comes from the cluster record, read over
	// TLS with the role limited to the namespace.
	code, out, errOut = ctl(t, "-endpoints", srv.Endpoint(), "-timeout", "3s", "-cacert", pki.CAFile(),
		"-cert", client.CertFile, "-key", client.KeyFile, "-user", "ctl-ro:pw-ro", "-namespace", "sec", "plan", "join", "r2")
	if code != exitOK || !strings.Contains(out, "plan: runner r2 joins") || !strings.Contains(out, "8 shards, strategy") ||
		strings.Contains(errOut, "no cluster record") {
		t.Errorf("plan with TLS and a read-only user: exit %d\n%s%s", code, out, errOut)
	}

	// Misconfigurations: the exit status and what the user reads.
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"no namespace with a role limited to one", with("-user", "ctl-rw", "-password", "pw-rw", "status"),
			exitFail, []string{"refused to list its keys", "set -namespace"}},
		{"read-only role drains", with("-user", "ctl-ro", "-password", "pw-ro", "-namespace", "sec", "drain", "r1", "-force"),
			exitFail, []string{"permission denied"}},
		{"wrong password", with("-user", "ctl-rw", "-password", "wrong", "-namespace", "sec", "status"),
			exitFail, []string{"authentication failed", "check -user and -password"}},
		{"role of another namespace", with("-user", "ctl-rw", "-password", "pw-rw", "-namespace", "other", "status"),
			exitFail, []string{"permission denied"}},
		{"no user", with("-namespace", "sec", "status"),
			exitFail, []string{"permission denied"}},
		{"no client certificate", []string{"-endpoints", srv.Endpoint(), "-shards", "8", "-timeout", "2s", "-cacert", pki.CAFile(),
			"-user", "ctl-rw", "-password", "pw-rw", "-namespace", "sec", "status"},
			exitFail, []string{"etcd client for", "certificate required"}},
		{"another CA", []string{"-endpoints", srv.Endpoint(), "-shards", "8", "-timeout", "2s", "-cacert", testenv.NewPKI(t, "other").CAFile(),
			"-cert", client.CertFile, "-key", client.KeyFile, "-user", "ctl-rw", "-password", "pw-rw", "-namespace", "sec", "status"},
			exitFail, []string{"etcd client for", "certificate signed by unknown authority"}},
		{"plaintext to a TLS etcd", []string{"-endpoints", srv.Endpoint(), "-shards", "8", "-timeout", "2s",
			"-user", "ctl-rw", "-password", "pw-rw", "-namespace", "sec", "status"},
			exitFail, []string{"etcd client for", "speaks TLS"}},
		{"cert without key", with("-key", "", "-namespace", "sec", "status"), exitUsage, []string{"-cert and -key go together"}},
		{"user without password", with("-user", "ctl-rw", "-namespace", "sec", "status"), exitUsage, []string{"needs a password"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := ctl(t, tc.args...)
			t.Logf("exit %d: %s", code, strings.TrimSpace(errOut))
			if code != tc.code {
				t.Errorf("exit %d, want %d\n%s%s", code, tc.code, out, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr lacks %q:\n%s", w, errOut)
				}
			}
		})
	}
}
