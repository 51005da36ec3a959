package runner_test

import (
	"crypto/tls"
	"errors"
	"strings"
	"testing"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
	"github.com/shardhost/shardhost/transport"
)

// TestInsecureTransportOnlyByChoice: a runner whose transport would listen
// beyond loopback without TLS is refused by New with an
// *InsecureTransportError naming the fix, unless AllowInsecureTransport
// says so; loopback needs no flag, and TLS, a client-only runner or a
// transport of the caller's own are not concerned.
func TestInsecureTransportOnlyByChoice(t *testing.T) {
	s := memory.New()
	defer s.Cluster().Close()
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS13}
	for _, tc := range []struct {
		name    string
		cfg     runner.Config
		refused bool
	}{
		{"every interface", runner.Config{ListenAddr: ":7100"}, true},
		{"every IPv4 interface", runner.Config{ListenAddr: "0.0.0.0:0"}, true},
		{"every IPv6 interface", runner.Config{ListenAddr: "[::]:0"}, true},
		{"a private address", runner.Config{ListenAddr: "10.0.0.5:7100"}, true},
		{"a host name", runner.Config{ListenAddr: "runner-1.internal:7100"}, true},
		{"Address only (ListenAddr defaults to it)", runner.Config{Address: "10.0.0.5:7100"}, true},
		{"loopback", runner.Config{ListenAddr: "127.0.0.1:0"}, false},
		{"another loopback address", runner.Config{ListenAddr: "127.1.2.3:0"}, false},
		{"IPv6 loopback", runner.Config{ListenAddr: "[::1]:0"}, false},
		{"localhost", runner.Config{ListenAddr: "localhost:0"}, false},
		{"with AllowInsecureTransport", runner.Config{ListenAddr: ":7100", AllowInsecureTransport: true}, false},
		{"with TLS", runner.Config{ListenAddr: ":7100", TLS: tlsCfg, PeerTLS: tlsCfg}, false},
		{"client-only", runner.Config{ListenAddr: ":7100", ClientOnly: true}, false},
		{"a transport of the caller's", runner.Config{ListenAddr: ":7100", Transport: transport.NewInmemNetwork().Transport("a:1")}, false},
	} {
		tc.cfg.ID = "a"
		r, err := runner.New(s, tc.cfg)
		if r != nil {
			r.Close()
		}
		var ie *runner.InsecureTransportError
		switch {
		case !tc.refused && err != nil:
			t.Errorf("%s: New = %v, want it accepted", tc.name, err)
		case tc.refused && (!errors.As(err, &ie) || !errors.Is(err, runner.ErrInvalidConfig)):
			t.Errorf("%s: New = %v, want an *InsecureTransportError matching ErrInvalidConfig", tc.name, err)
		case tc.refused:
			for _, fix := range []string{"Config.TLS", "loopback", "Config.AllowInsecureTransport"} {
				if !strings.Contains(err.Error(), fix) {
					t.Errorf("%s: %v does not name %s", tc.name, err, fix)
				}
			}
		}
	}
}
