package runner

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/sharding"
)

// mtls returns the server and peer TLS configurations of a runner named
// name (its certificate's DNS name) under pki.
func mtls(t *testing.T, pki *testenv.PKI, name string) (server, peer *tls.Config) {
	t.Helper()
	c := pki.MustIssue(t, name)
	return pki.ServerTLS(c), pki.ClientTLS(c)
}

// askFails asks through r until ctx (2 s) ends and wants it to fail.
func askFails(t *testing.T, r *Runner, key, why string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := echoMethod.Ask(ctx, r, key, echoReq{Text: "x"})
	if err == nil {
		t.Fatalf("Ask through %s succeeded; want it refused (%s)", r.ID(), why)
	}
	if errors.Is(err, ErrMaybeDelivered) {
		t.Fatalf("a refused handshake was reported as maybe delivered: %v", err)
	}
	return err
}

// askOK asks through r until it succeeds (the view of a new runner fills
// in) and returns the runner that answered.
func askOK(t *testing.T, r *Runner, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	for ctx.Err() == nil {
		var got echoResp
		if got, err = echoMethod.Ask(ctx, r, key, echoReq{Text: "hi"}); err == nil {
			return got.Runner
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("Ask %q through %s: %v", key, r.ID(), err)
	return ""
}

// TestPeerOfAnotherCARefused: with mutual TLS, a peer whose client
// certificate comes from another CA is refused in the handshake, and the
// runner it tried logs why (at WARN, with its address).
func TestPeerOfAnotherCARefused(t *testing.T) {
	t.Parallel()
	pki, other := testenv.NewPKI(t, "cluster"), testenv.NewPKI(t, "other")
	tc := newTestCluster(t)
	log := &testenv.WarnLines{}
	srvTLS, peerTLS := mtls(t, pki, "a")
	tc.start(Config{ID: "a", TLS: srvTLS, PeerTLS: peerTLS, Logger: slog.New(log)})
	stranger := other.MustIssue(t, "stranger")
	// Go's client sends a certificate only if the server's CAs issued it:
	// the stranger presents its own regardless, as an impostor would.
	bad := tc.start(Config{ID: "stranger", ClientOnly: true, PeerTLS: &tls.Config{
		RootCAs: pki.Pool(), MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &stranger.TLS, nil },
	}})
	tc.waitOwned(16)
	err := askFails(t, bad, "k", "client certificate of another CA")
	t.Logf("the stranger's Ask: %v", err)
	got := log.Find("incoming connection refused in the TLS handshake", "certificate signed by unknown authority", "remote=127.0.0.1:")
	if len(got) != 1 {
		t.Fatalf("a's WARN lines about the refusal: %q, want 1 (then once a minute)", log.Find("refused"))
	}
	t.Logf("a logged: %s", got[0])
}

// TestRequireClusterPeers: with RequireClusterPeers, a client whose
// certificate (same CA) names neither a registered runner nor one of
// ClientPeerNames is refused and logged; a gateway listed in
// ClientPeerNames and the runners themselves get through; and a runner
// whose server certificate does not name it is refused by the peers
// dialing it.
func TestRequireClusterPeers(t *testing.T) {
	t.Parallel()
	pki := testenv.NewPKI(t, "cluster")
	tc := newTestCluster(t)
	logs := map[string]*testenv.WarnLines{}
	start := func(id, certName string, clientOnly bool) *Runner {
		srvTLS, peerTLS := mtls(t, pki, certName)
		logs[id] = &testenv.WarnLines{}
		return tc.start(Config{ID: id, TLS: srvTLS, PeerTLS: peerTLS, ClientOnly: clientOnly,
			RequireClusterPeers: true, ClientPeerNames: []string{"gw"}, Logger: slog.New(logs[id])})
	}
	a := start("a", "a", false)
	b := start("b", "b", false)
	gw := start("gw", "gw", true)
	intruder := start("intruder", "intruder", true)
	tc.waitSettled()

	// The gateway reaches both runners; each runner reaches the other.
	served := map[string]bool{}
	for i := range 64 {
		served[askOK(t, gw, keyOf(t, i))] = true
	}
	if !served["a"] || !served["b"] {
		t.Fatalf("the gateway's asks were served by %v, want a and b", served)
	}
	for _, r := range []*Runner{a, b} {
		for i := range 16 {
			askOK(t, r, keyOf(t, i))
		}
	}
	// A client of the same CA that is not in the cluster.
	err := askFails(t, intruder, keyOf(t, 0), "its certificate names no runner of the cluster")
	t.Logf("the intruder's Ask: %v", err)
	found := 0
	for _, id := range []string{"a", "b"} {
		found += len(logs[id].Find("incoming connection refused", `["intruder"]`, "no registered runner and none of ClientPeerNames"))
	}
	if found == 0 {
		t.Errorf("no runner logged the intruder's refusal: a %q, b %q", logs["a"].Find("refused"), logs["b"].Find("refused"))
	}

	// c registers as "c" with a certificate naming "mallory": the others
	// refuse to send to it.
	start("c", "mallory", false)
	tc.waitSettled()
	var onC string
	for i := 0; onC == ""; i++ {
		if k := keyOf(t, i); tc.ownerOf(k) == "c" {
			onC = k
		}
	}
	err = askFails(t, gw, onC, "the server certificate of c names mallory")
	t.Logf("the gateway's Ask to c: %v", err)
	if got := logs["gw"].Find("connection to a peer refused", "mallory"); len(got) == 0 {
		t.Errorf("the gateway did not log refusing c: %q", logs["gw"].Find("refused"))
	}
}

// keyOf returns the i-th test key.
func keyOf(t *testing.T, i int) string {
	t.Helper()
	return "k" + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + string(rune('a'+i/26))
}

// ownerOf returns the ID of the runner owning key's shard, "" if none.
func (tc *testCluster) ownerOf(key string) string {
	id := sharding.ShardOf(key, 16)
	for name, r := range tc.rs {
		if _, ok := r.Owned()[id]; ok {
			return name
		}
	}
	return ""
}

// TestRequireClusterPeersValidates: the settings it needs.
func TestRequireClusterPeersValidates(t *testing.T) {
	pki := testenv.NewPKI(t, "cluster")
	srvTLS, peerTLS := mtls(t, pki, "a")
	noClientAuth := srvTLS.Clone()
	noClientAuth.ClientAuth = tls.NoClientCert
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"complete", Config{RequireClusterPeers: true, ListenAddr: "127.0.0.1:0", TLS: srvTLS, PeerTLS: peerTLS}, true},
		{"client-only without server TLS", Config{RequireClusterPeers: true, ClientOnly: true, PeerTLS: peerTLS}, true},
		{"no PeerTLS", Config{RequireClusterPeers: true, ListenAddr: "127.0.0.1:0", TLS: srvTLS}, false},
		{"no client certificates required", Config{RequireClusterPeers: true, ListenAddr: "127.0.0.1:0", TLS: noClientAuth, PeerTLS: peerTLS}, false},
		{"ClientPeerNames alone", Config{ClientPeerNames: []string{"gw"}}, false},
	} {
		tc.cfg.ID = "a"
		_, err := New(newTestCluster(t).c.NewStore("a"), tc.cfg)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
			t.Errorf("%s: New = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}
