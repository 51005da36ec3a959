package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// PKI is a throw-away certificate authority: an ECDSA P-256 CA, made at
// test time, whose certificate is written to a file (for etcd's
// --trusted-ca-file, etcdctl's --cacert) and which issues certificates for
// loopback. Its certificates are valid from an hour ago for a day. Safe for
// concurrent use.
type PKI struct {
	dir    string
	name   string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caFile string
	pool   *x509.CertPool

	mu     sync.Mutex
	serial int64
}

// Cert is a certificate issued by a [PKI]: the PEM files (certificate and
// unencrypted key) and the parsed pair.
type Cert struct {
	CertFile, KeyFile string
	TLS               tls.Certificate
	Leaf              *x509.Certificate
}

// CertOption changes a certificate issued by [PKI.Issue].
type CertOption func(*x509.Certificate)

// WithCommonName sets the certificate's subject common name (by default
// its name). With client-certificate authentication (--client-cert-auth)
// and auth enabled, etcd takes a client's common name as its user name
// when the client sends no token.
func WithCommonName(cn string) CertOption {
	return func(c *x509.Certificate) { c.Subject.CommonName = cn }
}

// WithDNSNames sets the certificate's DNS subject alternative names (by
// default its name alone).
func WithDNSNames(names ...string) CertOption {
	return func(c *x509.Certificate) { c.DNSNames = names }
}

// WithURIs adds URI subject alternative names.
func WithURIs(uris ...*url.URL) CertOption {
	return func(c *x509.Certificate) { c.URIs = append(c.URIs, uris...) }
}

// WithIPs sets the certificate's IP subject alternative names (by default
// 127.0.0.1 and ::1).
func WithIPs(ips ...net.IP) CertOption {
	return func(c *x509.Certificate) { c.IPAddresses = ips }
}

// WithValidity sets the certificate's validity period.
func WithValidity(notBefore, notAfter time.Time) CertOption {
	return func(c *x509.Certificate) { c.NotBefore, c.NotAfter = notBefore, notAfter }
}

// NewPKI makes a CA in a new directory under t.TempDir(); name is its
// common name.
func NewPKI(t testing.TB, name string) *PKI {
	t.Helper()
	p, err := NewPKIDir(t.TempDir(), name)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return p
}

// NewPKIDir makes a CA whose files live in dir (created if missing): it is
// [NewPKI] for programs that are not tests. name is the CA's common name;
// its certificate is written to dir/{name}-ca.pem.
func NewPKIDir(dir, name string) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("testenv: pki: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("testenv: pki: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("testenv: pki: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("testenv: pki: %w", err)
	}
	p := &PKI{dir: dir, name: name, ca: ca, caKey: key, caFile: filepath.Join(dir, name+"-ca.pem"), pool: x509.NewCertPool(), serial: 1}
	p.pool.AddCert(ca)
	if err := writeFileAtomic(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, fmt.Errorf("testenv: pki: %w", err)
	}
	return p, nil
}

// CAFile returns the path of the CA certificate (PEM).
func (p *PKI) CAFile() string { return p.caFile }

// Pool returns a pool holding the CA certificate alone.
func (p *PKI) Pool() *x509.CertPool { return p.pool }

// Dir returns the directory holding the PKI's files.
func (p *PKI) Dir() string { return p.dir }

// Issue makes a certificate for both server and client authentication with
// common name name, DNS name name, IP addresses 127.0.0.1 and ::1 (options
// change them), and writes it to dir/{name}.pem and dir/{name}-key.pem,
// replacing earlier files of that name atomically (each file by a rename),
// so that a server reading them per handshake (etcd does) sees either the
// old pair or the new one except between the two renames.
func (p *PKI) Issue(name string, opts ...CertOption) (Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Cert{}, fmt.Errorf("testenv: issue %s: %w", name, err)
	}
	p.mu.Lock()
	p.serial++
	serial := p.serial
	p.mu.Unlock()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{name},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, o := range opts {
		o(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return Cert{}, fmt.Errorf("testenv: issue %s: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return Cert{}, fmt.Errorf("testenv: issue %s: %w", name, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Cert{}, fmt.Errorf("testenv: issue %s: %w", name, err)
	}
	c := Cert{
		CertFile: filepath.Join(p.dir, name+".pem"), KeyFile: filepath.Join(p.dir, name+"-key.pem"),
		TLS:  tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		Leaf: leaf,
	}
	if err := writeFileAtomic(c.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return Cert{}, fmt.Errorf("testenv: issue %s: %w", name, err)
	}
	if err := writeFileAtomic(c.CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return Cert{}, fmt.Errorf("testenv: issue %s: %w", name, err)
	}
	return c, nil
}

// MustIssue is [PKI.Issue] failing t on error.
func (p *PKI) MustIssue(t testing.TB, name string, opts ...CertOption) Cert {
	t.Helper()
	c, err := p.Issue(name, opts...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return c
}

// ServerTLS returns a server configuration presenting c and requiring
// client certificates issued by this CA (TLS 1.2 or later).
func (p *PKI) ServerTLS(c Cert) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{c.TLS},
		ClientCAs:    p.pool, ClientAuth: tls.RequireAndVerifyClientCert,
		MinVersion: tls.VersionTLS12,
	}
}

// ClientTLS returns a client configuration trusting this CA and presenting
// c (none when c is the zero Cert).
func (p *PKI) ClientTLS(c Cert) *tls.Config {
	cfg := &tls.Config{RootCAs: p.pool, MinVersion: tls.VersionTLS12}
	if c.TLS.Certificate != nil {
		cfg.Certificates = []tls.Certificate{c.TLS}
	}
	return cfg
}

// writeFileAtomic writes data to a temporary file beside path and renames
// it over path.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}
