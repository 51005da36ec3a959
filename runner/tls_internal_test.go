package runner

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"testing"
	"time"
)

// testPKI is a throw-away CA issuing loopback certificates.
type testPKI struct {
	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
	pool  *x509.CertPool
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "shardhost test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &testPKI{ca: ca, caKey: key, pool: pool}
}

func (p *testPKI) issue(t *testing.T, name string, serial int64) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// Mutual TLS between runners: a peer with a certificate of the cluster's CA
// is served; one without is refused (not delivered, retried until its
// context ends).
func TestMutualTLSTransport(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	tc := newTestCluster(t)
	serverTLS := &tls.Config{
		Certificates: []tls.Certificate{pki.issue(t, "owner", 2)},
		ClientCAs:    pki.pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	}
	clientTLS := &tls.Config{
		Certificates: []tls.Certificate{pki.issue(t, "gateway", 3)},
		RootCAs:      pki.pool, MinVersion: tls.VersionTLS13,
	}
	a := tc.start(Config{ID: "a", TLS: serverTLS, PeerTLS: clientTLS})
	good := tc.start(Config{ID: "good", ClientOnly: true, PeerTLS: clientTLS})
	bad := tc.start(Config{ID: "bad", ClientOnly: true, PeerTLS: &tls.Config{RootCAs: pki.pool, MinVersion: tls.VersionTLS13}})
	tc.waitOwned(16)
	_ = a

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got echoResp
	var err error
	for ctx.Err() == nil { // until the gateway's view has the owner
		if got, err = echoMethod.Ask(ctx, good, "k", echoReq{Text: "over tls"}); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil || got.Text != "over tls" || got.Runner != "a" {
		t.Fatalf("Ask over mutual TLS = %+v, %v", got, err)
	}
	bctx, bcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer bcancel()
	_, err = echoMethod.Ask(bctx, bad, "k", echoReq{Text: "no client cert"})
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ask without a client certificate = %v, want refused until the deadline", err)
	}
	if errors.Is(err, ErrMaybeDelivered) {
		t.Fatalf("a refused handshake was reported as maybe delivered: %v", err)
	}
}
