package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// ErrTLSMismatch is returned by ProbeTLS when the client and the endpoint
// disagree on TLS: one speaks it, the other does not.
var ErrTLSMismatch = errors.New("etcd: TLS mismatch")

// ProbeTLS connects to endpoint ("host:port", or a URL with http:// or
// https://) and does what a client with TLS configuration cfg (nil: none)
// would do first, to say why it cannot connect: the etcd client only
// reports its dial timeout when a handshake fails. With cfg it completes
// a TLS handshake and waits briefly for the server's verdict on the client
// certificate, returning the handshake's error (an unknown authority, a
// name mismatch, the server requiring or refusing the certificate) or nil;
// a plaintext endpoint gives ErrTLSMismatch. Without cfg it reports
// ErrTLSMismatch when the endpoint speaks TLS, nil otherwise. ctx bounds
// it (and at most 3 s).
func ProbeTLS(ctx context.Context, endpoint string, cfg *tls.Config) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	addr := endpoint
	for _, scheme := range []string{"https://", "http://", "unixs://", "unix://"} {
		addr = strings.TrimPrefix(addr, scheme)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	probe := cfg
	if probe == nil { // only to learn whether the endpoint speaks TLS
		probe = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // nothing is sent
	}
	probe = probe.Clone()
	if probe.ServerName == "" {
		probe.ServerName = host
	}
	d := tls.Dialer{Config: probe}
	conn, err := d.DialContext(ctx, "tcp", addr)
	var rhe tls.RecordHeaderError
	switch {
	case errors.As(err, &rhe), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		// Not a TLS answer to the client's hello: an HTTP reply, or a
		// plaintext etcd closing the connection (it does).
		if cfg == nil {
			return nil
		}
		return fmt.Errorf("%w: %s does not speak TLS (a plaintext etcd: drop the TLS settings)", ErrTLSMismatch, addr)
	case err != nil && cfg == nil:
		var alert tls.AlertError
		if errors.As(err, &alert) { // it answered in TLS
			return fmt.Errorf("%w: %s speaks TLS (give the CA, and a client certificate if it asks for one)", ErrTLSMismatch, addr)
		}
		return fmt.Errorf("connect to %s: %w", addr, err)
	case err != nil:
		return fmt.Errorf("TLS handshake with %s: %w", addr, err)
	}
	defer conn.Close()
	if cfg == nil {
		return fmt.Errorf("%w: %s speaks TLS (give the CA, and a client certificate if it asks for one)", ErrTLSMismatch, addr)
	}
	// With TLS 1.3 the server judges the client certificate after the
	// client's handshake ended: its refusal arrives as an alert on the
	// first read. A server that accepted it waits for the HTTP/2 preface.
	_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	var b [1]byte
	if _, err := conn.Read(b[:]); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		return fmt.Errorf("TLS handshake with %s: the server closed the connection: %w", addr, err)
	}
	return nil
}
