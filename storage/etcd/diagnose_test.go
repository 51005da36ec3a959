package etcd_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// TestConnectionErrorNamesTheDialError: when etcd cannot be reached, the
// store says why in the connection's words — a refused connection, a DNS
// failure, a TLS handshake that fails, an endpoint that never answers —
// instead of a call's "context deadline exceeded"; it says nothing (nil)
// when one endpoint answers.
func TestConnectionErrorNamesTheDialError(t *testing.T) {
	srv := testenv.StartEtcd(t)
	dead := testenv.FreeAddr(t)
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts connections, never speaks
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	for _, c := range []struct {
		name      string
		endpoints []string
		tls       bool
		want      []string // substrings of the error; none: nil
	}{
		{"refused", []string{dead}, false, []string{dead + ": dial tcp " + dead, "connection refused"}},
		{"dns", []string{"no-such-host.invalid:2379"}, false, []string{"no-such-host.invalid:2379: ", "lookup no-such-host.invalid"}},
		{"tls", []string{srv.Endpoint()}, true, []string{srv.Endpoint() + ": ", "handshake"}},
		{"silent", []string{silent.Addr().String()}, false, []string{silent.Addr().String() + ": no answer"}},
		{"reachable", []string{srv.Endpoint()}, false, nil},
		{"one of two reachable", []string{dead, srv.Endpoint()}, false, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := etcd.ClientConfig(c.endpoints)
			cfg.Logger = zap.NewNop()
			if c.tls {
				cfg.TLS = &tls.Config{InsecureSkipVerify: true} // the server speaks plain gRPC
			}
			cli, err := clientv3.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			s, err := etcd.New(cli, "diagnose", etcd.Config{})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			err = s.ConnectionError(ctx)
			if c.want == nil {
				if err != nil {
					t.Fatalf("ConnectionError = %v, want nil (an endpoint answers)", err)
				}
				return
			}
			if !errors.Is(err, storage.ErrUnavailable) || !strings.Contains(err.Error(), "etcd unreachable: ") {
				t.Fatalf("ConnectionError = %v, want storage.ErrUnavailable saying etcd is unreachable", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("ConnectionError = %q, want it to contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "deadline exceeded") {
				t.Errorf("ConnectionError = %q names the wait, not the connection", err)
			}
		})
	}
}
