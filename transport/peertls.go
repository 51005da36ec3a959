package transport

import (
	"context"
	"crypto/tls"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
)

// Who may talk to a runner: TLS handshakes refused (by the CA check or by
// GRPCConfig.VerifyPeer) are logged with their reason, rate-limited.

// handshakeLogEvery is how often refused handshakes are logged at WARN
// (the first at once; the others are counted into the next line).
const handshakeLogEvery = time.Minute

// handshakeLog rate-limits the log of refused handshakes, one direction
// each (a noisy peer must not flood the log).
type handshakeLog struct {
	refused atomic.Int64 // since the transport started
	last    atomic.Int64 // when last logged (since clockBase); 0: never
}

// note counts a refused handshake and reports whether to log it now.
func (h *handshakeLog) note() (total int64, log bool) {
	n := h.refused.Add(1)
	now := int64(time.Since(clockBase))
	last := h.last.Load()
	if last != 0 && time.Duration(now-last) < handshakeLogEvery {
		return n, false
	}
	return n, h.last.CompareAndSwap(last, now)
}

// loggingCreds are TLS transport credentials that log refused handshakes.
type loggingCreds struct {
	credentials.TransportCredentials
	t    *GRPC
	peer string // the address dialed; "" on the server
}

// ServerHandshake implements credentials.TransportCredentials: a client
// refused (no certificate, one of another CA, one VerifyPeer refuses) is
// logged with its address and the reason.
func (c loggingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		if n, ok := c.t.inRefused.note(); ok {
			c.t.log.Warn("transport: incoming connection refused in the TLS handshake",
				"remote", raw.RemoteAddr().String(), "err", err, "refused_total", n)
		}
	}
	return conn, info, err
}

// ClientHandshake implements credentials.TransportCredentials: a peer
// refused (a certificate of another CA, one VerifyPeer refuses) is logged
// with its address and the reason.
func (c loggingCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil && ctx.Err() == nil {
		if n, ok := c.t.outRefused.note(); ok {
			c.t.log.Warn("transport: connection to a peer refused in the TLS handshake",
				"peer", c.peer, "err", err, "refused_total", n)
		}
	}
	return conn, info, err
}

// Clone implements credentials.TransportCredentials.
func (c loggingCreds) Clone() credentials.TransportCredentials {
	return loggingCreds{TransportCredentials: c.TransportCredentials.Clone(), t: c.t, peer: c.peer}
}

// serverTLS returns the server's TLS configuration with VerifyPeer (if
// set) checking every client after the configuration's own checks.
func (t *GRPC) serverTLS() *tls.Config {
	cfg := t.cfg.TLS.Clone()
	if t.cfg.VerifyPeer != nil {
		cfg.VerifyConnection = chainVerify(cfg.VerifyConnection, func(cs tls.ConnectionState) error { return t.cfg.VerifyPeer("", cs) })
	}
	return cfg
}

// peerTLS returns the TLS configuration of connections to addr, with
// VerifyPeer (if set) checking the peer after the configuration's own
// checks.
func (t *GRPC) peerTLS(addr string) *tls.Config {
	cfg := t.cfg.PeerTLS.Clone()
	if t.cfg.VerifyPeer != nil {
		cfg.VerifyConnection = chainVerify(cfg.VerifyConnection, func(cs tls.ConnectionState) error { return t.cfg.VerifyPeer(addr, cs) })
	}
	return cfg
}

func chainVerify(first, then func(tls.ConnectionState) error) func(tls.ConnectionState) error {
	if first == nil {
		return then
	}
	return func(cs tls.ConnectionState) error {
		if err := first(cs); err != nil {
			return err
		}
		return then(cs)
	}
}
