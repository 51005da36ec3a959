package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// Reaching an etcd with client TLS and authentication: the flags are
// etcdctl's (--cacert, --cert, --key, --insecure-skip-tls-verify, --user,
// --password), each with an environment variable.

// Environment variables that give the TLS and authentication flags'
// defaults.
const (
	envCACert     = "SHARDHOST_ETCD_CACERT"
	envCert       = "SHARDHOST_ETCD_CERT"
	envKey        = "SHARDHOST_ETCD_KEY"
	envSkipVerify = "SHARDHOST_ETCD_INSECURE_SKIP_TLS_VERIFY"
	envUser       = "SHARDHOST_ETCD_USER"
	envPassword   = "SHARDHOST_ETCD_PASSWORD"
)

// etcdSecurity is how the client authenticates etcd and itself.
type etcdSecurity struct {
	cacert, cert, key string
	skipVerify        bool
	user, password    string
}

// etcdSecurityFromEnv returns the defaults given by the environment.
func etcdSecurityFromEnv() etcdSecurity {
	skip, _ := strconv.ParseBool(os.Getenv(envSkipVerify))
	return etcdSecurity{
		cacert: os.Getenv(envCACert), cert: os.Getenv(envCert), key: os.Getenv(envKey),
		skipVerify: skip, user: os.Getenv(envUser), password: os.Getenv(envPassword),
	}
}

func (s *etcdSecurity) register(fs *flag.FlagSet) {
	fs.StringVar(&s.cacert, "cacert", s.cacert, "verify etcd's certificate with this CA `file` (PEM; $"+envCACert+")")
	fs.StringVar(&s.cert, "cert", s.cert, "client certificate `file` (PEM) presented to etcd ($"+envCert+")")
	fs.StringVar(&s.key, "key", s.key, "key `file` (PEM) of -cert ($"+envKey+")")
	fs.BoolVar(&s.skipVerify, "insecure-skip-tls-verify", s.skipVerify, "use TLS but do not verify etcd's certificate: testing only ($"+envSkipVerify+")")
	fs.StringVar(&s.user, "user", s.user, "etcd `user`, or user:password ($"+envUser+")")
	fs.StringVar(&s.password, "password", s.password, "password of -user ($"+envPassword+"; prefer it to the flag, which other users of the machine can see)")
}

// tlsWanted reports whether any TLS setting was given.
func (s etcdSecurity) tlsWanted() bool {
	return s.cacert != "" || s.cert != "" || s.key != "" || s.skipVerify
}

// validate checks the settings that go together.
func (s etcdSecurity) validate() error {
	_, _, err := s.credentials()
	if (s.cert == "") != (s.key == "") {
		err = errors.Join(errors.New("-cert and -key go together"), err)
	}
	return err
}

// credentials returns the user and password, from -user user:password or
// -user and -password.
func (s etcdSecurity) credentials() (user, password string, err error) {
	user, password = s.user, s.password
	if u, p, ok := strings.Cut(user, ":"); ok {
		if password != "" {
			return "", "", errors.New("-user user:password and -password both give a password")
		}
		user, password = u, p
	}
	if user != "" && password == "" {
		return "", "", fmt.Errorf("-user %s needs a password: -user %s:PASSWORD, -password or $%s", user, user, envPassword)
	}
	if user == "" && password != "" {
		return "", "", errors.New("-password without -user")
	}
	return user, password, nil
}

// apply sets cfg's TLS and credentials. Endpoints given as https://...
// use TLS with the system's CAs when no TLS setting is given.
func (s etcdSecurity) apply(cfg *clientv3.Config) error {
	if err := s.validate(); err != nil {
		return err
	}
	if s.tlsWanted() {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: s.skipVerify}
		if s.cacert != "" {
			pem, err := os.ReadFile(s.cacert)
			if err != nil {
				return fmt.Errorf("-cacert: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return fmt.Errorf("-cacert %s: no PEM certificate in it", s.cacert)
			}
			tc.RootCAs = pool
		}
		if s.cert != "" {
			pair, err := tls.LoadX509KeyPair(s.cert, s.key)
			if err != nil {
				return fmt.Errorf("-cert/-key: %w", err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		cfg.TLS = tc
	}
	cfg.Username, cfg.Password, _ = s.credentials()
	return nil
}

// describe says how the client authenticates, for error messages.
func (s etcdSecurity) describe() string {
	var parts []string
	if s.tlsWanted() {
		parts = append(parts, "TLS")
	}
	if s.cert != "" {
		parts = append(parts, "client certificate "+s.cert)
	}
	if u, _, _ := strings.Cut(s.user, ":"); u != "" {
		parts = append(parts, "user "+u)
	}
	if len(parts) == 0 {
		return "plaintext, no user"
	}
	return strings.Join(parts, ", ")
}

// deniedHint adds what to check to an error of etcd refusing the client.
func deniedHint(err error) string {
	if !errors.Is(etcd.TranslateError(err), storage.ErrPermissionDenied) {
		return ""
	}
	return " (check -user and -password, or the role's permissions: reading a namespace needs read on \"/{namespace}/\", drain and undrain readwrite; see SECURITY.md)"
}

// tlsHint adds, to an error that says etcd could not be reached, what a
// TLS handshake with the first endpoint says (etcd.ProbeTLS): the etcd
// client reports only its dial timeout when the handshake fails.
func tlsHint(ctx context.Context, endpoint string, cfg *tls.Config, err error) string {
	if !errors.Is(etcd.TranslateError(err), storage.ErrUnavailable) {
		return ""
	}
	if perr := etcd.ProbeTLS(ctx, endpoint, cfg); perr != nil {
		return " (" + perr.Error() + ")"
	}
	return ""
}
