package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestSecureEtcdRefusesStrangers: a member started WithTLS and WithAuth
// serves the helpers' clients and etcdctl, refuses a client without a
// certificate of its CA, and a client with one but no credentials.
func TestSecureEtcdRefusesStrangers(t *testing.T) {
	pki := NewPKI(t, "etcd-test")
	e := StartEtcd(t, WithTLS(pki), WithAuth())
	if !strings.HasPrefix(e.ClientURL(), "https://") {
		t.Errorf("ClientURL() = %q, want https", e.ClientURL())
	}
	cli := e.Client(t)
	put(t, cli, "k", "v")
	mustGet(t, cli, "k", "v")
	if out := e.Cluster().MustEtcdctl(t, "get", "k", "--print-value-only"); strings.TrimSpace(out) != "v" {
		t.Errorf("etcdctl get k = %q, want v", out)
	}
	if out := e.Cluster().MustEtcdctl(t, "auth", "status"); !strings.Contains(out, "Authentication Status: true") {
		t.Errorf("etcdctl auth status = %q, want enabled", out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	try := func(what string, cfg clientv3.Config) error {
		t.Helper()
		cfg.DialTimeout = time.Second
		c, err := clientv3.New(cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		defer ccancel()
		_, err = c.Get(cctx, "k")
		t.Logf("%s: %v", what, err)
		return err
	}

	// Another CA's client certificate: the handshake fails.
	other := NewPKI(t, "other")
	cfg := EtcdClientConfig(e.Endpoint())
	cfg.TLS = pki.ClientTLS(other.MustIssue(t, "intruder"))
	if err := try("certificate of another CA", cfg); err == nil {
		t.Error("a client with another CA's certificate was served")
	}
	// No client certificate at all.
	cfg.TLS = pki.ClientTLS(Cert{})
	if err := try("no client certificate", cfg); err == nil {
		t.Error("a client without a certificate was served")
	}
	// A good certificate but no user: etcd takes its common name as the
	// user name, and there is no such user.
	cfg.TLS = pki.ClientTLS(e.Cluster().AdminCert())
	if err := try("no credentials", cfg); !errors.Is(err, rpctypes.ErrPermissionDenied) && !errors.Is(err, rpctypes.ErrUserEmpty) {
		t.Errorf("a client without credentials: %v, want permission denied or user empty", err)
	}
	// A wrong password.
	cfg.Username, cfg.Password = "root", "not-the-password"
	if err := try("wrong password", cfg); !errors.Is(err, rpctypes.ErrAuthFailed) {
		t.Errorf("a wrong password: %v, want %v", err, rpctypes.ErrAuthFailed)
	}
}

// TestRotateServerCert: after RotateServerCert, new connections get the
// new certificate (same CA) from the running member, and a client opened
// before keeps working.
func TestRotateServerCert(t *testing.T) {
	pki := NewPKI(t, "etcd-test")
	e := StartEtcd(t, WithTLS(pki), WithAuth())
	cli := e.Client(t)
	put(t, cli, "k", "v")
	served := func() string {
		t.Helper()
		conn, err := tls.Dial("tcp", e.Endpoint(), pki.ClientTLS(e.Cluster().AdminCert()))
		if err != nil {
			t.Fatalf("TLS handshake with %s: %v", e.Endpoint(), err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := served()
	if want := e.ServerCert().Leaf.SerialNumber.String(); before != want {
		t.Fatalf("served serial %s, want %s", before, want)
	}
	c, err := e.RotateServerCert()
	if err != nil {
		t.Fatal(err)
	}
	if after := served(); after != c.Leaf.SerialNumber.String() || after == before {
		t.Errorf("served serial after rotation = %s, want %s (was %s)", after, c.Leaf.SerialNumber, before)
	}
	mustGet(t, cli, "k", "v")
}
