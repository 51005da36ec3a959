package etcd_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// TestNewClientNamesTheCause: with a user and password, the etcd client
// logs in while it is made, and clientv3.New says only "context deadline
// exceeded" when it cannot connect; NewClient adds what a TLS handshake
// with each endpoint finds, and a refused login is a permission error.
func TestNewClientNamesTheCause(t *testing.T) {
	secure := secureEtcd(t)
	plain := testenv.StartEtcd(t)
	user := fmt.Sprintf("u%d", nextUser())
	secure.Cluster().AddPrefixUser(t, user, "pw-"+user, "/newclient/", "readwrite")
	base := secure.ClientConfig()
	base.Username, base.Password, base.DialTimeout = user, "pw-"+user, 2*time.Second
	other := testenv.NewPKI(t, "another-ca")
	for _, tc := range []struct {
		name     string
		change   func(*clientv3.Config)
		want     error  // nil: the client is made
		mismatch bool   // errors.Is ErrTLSMismatch
		says     string // in the error
	}{
		{name: "the right settings"},
		{name: "no TLS to a TLS etcd", change: func(c *clientv3.Config) { c.TLS = nil },
			want: storage.ErrUnavailable, mismatch: true, says: "speaks TLS"},
		{name: "a CA that did not sign the server's certificate", change: func(c *clientv3.Config) {
			c.TLS = c.TLS.Clone()
			c.TLS.RootCAs = other.Pool()
		}, want: storage.ErrUnavailable, says: "unknown authority"},
		{name: "no client certificate", change: func(c *clientv3.Config) {
			c.TLS = c.TLS.Clone()
			c.TLS.Certificates = nil
		}, want: storage.ErrUnavailable, says: "certificate required"},
		{name: "TLS to a plaintext etcd", change: func(c *clientv3.Config) { c.Endpoints = []string{plain.Endpoint()} },
			want: storage.ErrUnavailable, mismatch: true, says: "does not speak TLS"},
		{name: "a wrong password", change: func(c *clientv3.Config) { c.Password = "wrong" },
			want: storage.ErrPermissionDenied, says: "authentication failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			if tc.change != nil {
				tc.change(&cfg)
			}
			cli, err := etcd.NewClient(cfg)
			if cli != nil {
				defer cli.Close()
			}
			t.Logf("NewClient: %v", err)
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("NewClient = %v, want a client", err)
			case tc.want == nil:
				return
			case !errors.Is(err, tc.want) || errors.Is(err, etcd.ErrTLSMismatch) != tc.mismatch || !strings.Contains(err.Error(), tc.says):
				t.Errorf("NewClient = %v, want an error matching %v (ErrTLSMismatch: %v) that says %q", err, tc.want, tc.mismatch, tc.says)
			}
		})
	}
}
