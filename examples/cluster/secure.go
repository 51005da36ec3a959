package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/runner"
)

// Running against an etcd with client TLS and authentication, and with
// mutual TLS between the runners (run.sh with SECURE=1, make
// demo-cluster-secure). The etcd flags are etcdctl's names.

// envPassword gives the etcd password (kept off the command line, which
// other users of the machine can read).
const envPassword = "SHARDHOST_ETCD_PASSWORD"

// security is the TLS and authentication part of the command line.
type security struct {
	cacert, cert, key string // etcd: CA, client certificate and key
	user              string // etcd user; password from $SHARDHOST_ETCD_PASSWORD

	tlsCA, tlsCert, tlsKey string // transport: mutual TLS between runners
	requirePeers           bool
	clientPeers            string
}

func (s *security) register(fs *flag.FlagSet) {
	fs.StringVar(&s.cacert, "cacert", "", "etcd: verify its certificate with this CA `file`")
	fs.StringVar(&s.cert, "cert", "", "etcd: client certificate `file`")
	fs.StringVar(&s.key, "key", "", "etcd: key `file` of -cert")
	fs.StringVar(&s.user, "user", "", "etcd `user` (password in $"+envPassword+")")
	fs.StringVar(&s.tlsCA, "tls-ca", "", "transport: mutual TLS between runners with this CA `file`")
	fs.StringVar(&s.tlsCert, "tls-cert", "", "transport: this runner's certificate `file` (its DNS name: the runner ID)")
	fs.StringVar(&s.tlsKey, "tls-key", "", "transport: key `file` of -tls-cert")
	fs.BoolVar(&s.requirePeers, "require-cluster-peers", false, "transport: a peer's certificate must name a runner of the cluster (runner.Config.RequireClusterPeers)")
	fs.StringVar(&s.clientPeers, "client-peers", "", "transport: certificate names of the gateways allowed with -require-cluster-peers, comma-separated")
}

// etcdClient sets the etcd client's TLS and credentials.
func (s security) etcdClient(cfg *clientv3.Config) error {
	if s.cacert != "" || s.cert != "" {
		tc, err := loadTLS(s.cacert, s.cert, s.key)
		if err != nil {
			return fmt.Errorf("etcd TLS: %w", err)
		}
		cfg.TLS = tc
	}
	if s.user != "" {
		cfg.Username, cfg.Password = s.user, os.Getenv(envPassword)
		if cfg.Password == "" {
			return fmt.Errorf("-user %s: no password in $%s", s.user, envPassword)
		}
	}
	return nil
}

// runnerTLS sets the runner's transport TLS: its server requires client
// certificates of the CA, its connections present its certificate.
func (s security) runnerTLS(cfg *runner.Config) error {
	if s.tlsCA == "" {
		if s.requirePeers {
			return errors.New("-require-cluster-peers needs -tls-ca, -tls-cert and -tls-key")
		}
		return nil
	}
	tc, err := loadTLS(s.tlsCA, s.tlsCert, s.tlsKey)
	if err != nil {
		return fmt.Errorf("transport TLS: %w", err)
	}
	cfg.TLS = &tls.Config{
		Certificates: tc.Certificates, ClientCAs: tc.RootCAs, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	}
	cfg.PeerTLS = tc
	cfg.RequireClusterPeers = s.requirePeers
	for n := range strings.SplitSeq(s.clientPeers, ",") {
		if n = strings.TrimSpace(n); n != "" {
			cfg.ClientPeerNames = append(cfg.ClientPeerNames, n)
		}
	}
	return nil
}

// loadTLS returns a client configuration trusting the CA in caFile and
// presenting the certificate in certFile (with keyFile).
func loadTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS13}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate", caFile)
		}
	}
	if certFile != "" || keyFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}
