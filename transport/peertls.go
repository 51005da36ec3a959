package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
)

// Who may talk to a runner: TLS handshakes refused (by the CA check or by
// GRPCConfig.VerifyPeer) are logged with their reason, rate-limited per
// peer and kind of reason, so that one peer's junk does not hide another
// peer's refusal, nor one reason another.

// handshakeLogEvery is how often refused handshakes of one peer host and
// kind of reason are logged at WARN: the first at once, the others counted
// into that pair's next line ("suppressed"). Every line also tells the
// refusals of pairs no longer or not tracked that no line told yet
// ("suppressed_elsewhere"), and the direction's total ("refused_total").
const handshakeLogEvery = time.Minute

// handshakeLogKeys bounds the (peer host, reason) pairs tracked per
// direction. A refusal of a pair beyond it (a flood from many addresses)
// is logged at most once per handshakeLogEvery for all such pairs, and
// counted into the next line otherwise: bounded memory, and at most
// handshakeLogKeys+1 lines per handshakeLogEvery.
const handshakeLogKeys = 256

// handshakeLog rate-limits the log of refused handshakes of one direction.
// The zero value is ready for use.
type handshakeLog struct {
	refused atomic.Int64 // since the transport started

	mu            sync.Mutex
	keys          map[refusalKey]*refusalLog
	elsewhere     int64     // refusals not logged of pairs not tracked, or no longer (see sweep)
	elsewhereLast time.Time // when a refusal of an untracked pair was last logged
}

// refusalKey is what a rate limit applies to: a peer host (without the
// port, which a peer changes at will) and a kind of reason (refusalReason).
type refusalKey struct{ peer, reason string }

type refusalLog struct {
	last       time.Time // when last logged
	suppressed int64     // refusals not logged since
}

// refusalNote is what a logged line says besides the error: the kind of
// reason, the refusals of the same peer host and reason not logged since
// its previous line, those of other pairs not logged and not told yet, and
// the direction's total.
type refusalNote struct {
	reason                   string
	suppressed, elsewhere, n int64
}

// note counts a refused handshake of peer for err and reports whether to
// log it now, and what the line adds.
func (h *handshakeLog) note(peer string, err error) (refusalNote, bool) {
	key := refusalKey{peer: peerHost(peer), reason: refusalReason(err)}
	out := refusalNote{reason: key.reason, n: h.refused.Add(1)}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keys == nil {
		h.keys = make(map[refusalKey]*refusalLog)
	}
	l, ok := h.keys[key]
	if !ok && len(h.keys) >= handshakeLogKeys {
		h.sweep(now)
	}
	if !ok && len(h.keys) < handshakeLogKeys {
		l, ok = &refusalLog{}, true
		h.keys[key] = l
	}
	switch {
	case !ok && !h.elsewhereLast.IsZero() && now.Sub(h.elsewhereLast) < handshakeLogEvery:
		h.elsewhere++
		return out, false
	case !ok:
		h.elsewhereLast = now
	case !l.last.IsZero() && now.Sub(l.last) < handshakeLogEvery:
		l.suppressed++
		return out, false
	default:
		out.suppressed, l.suppressed, l.last = l.suppressed, 0, now
	}
	out.elsewhere, h.elsewhere = h.elsewhere, 0
	return out, true
}

// sweep forgets the pairs last logged handshakeLogEvery or more ago (their
// next refusal would be logged anyway); what they suppressed since is told
// in the next line of any pair.
func (h *handshakeLog) sweep(now time.Time) {
	for k, l := range h.keys {
		if now.Sub(l.last) >= handshakeLogEvery {
			h.elsewhere += l.suppressed
			delete(h.keys, k)
		}
	}
}

// peerHost is addr without its port.
func peerHost(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// refusalReason names the kind of a refused handshake's error, from its
// type: a bounded set, so that details (names, times) in the error's text
// do not make every refusal a new key.
func refusalReason(err error) string {
	var (
		rhe      tls.RecordHeaderError
		alert    tls.AlertError
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		hostname x509.HostnameError
		verify   *tls.CertificateVerificationError
		ne       net.Error
		refused  *peerRefusedError
	)
	switch {
	case errors.As(err, &refused):
		return "peer check"
	case errors.As(err, &rhe):
		return "not TLS"
	case errors.As(err, &unknown):
		return "unknown authority"
	case errors.As(err, &invalid):
		return "invalid certificate"
	case errors.As(err, &hostname):
		return "name mismatch"
	case errors.As(err, &verify):
		return "certificate not verified"
	case errors.As(err, &alert):
		return "alert: " + alert.Error()
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "closed during the handshake"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "other"
}

// peerRefusedError is GRPCConfig.VerifyPeer's refusal, marked so that the
// log tells it from the TLS checks' own.
type peerRefusedError struct{ err error }

func (e *peerRefusedError) Error() string { return e.err.Error() }
func (e *peerRefusedError) Unwrap() error { return e.err }

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
		remote := raw.RemoteAddr().String()
		if r, ok := c.t.inRefused.note(remote, err); ok {
			c.t.log.Warn("transport: incoming connection refused in the TLS handshake",
				"remote", remote, "err", err, "reason", r.reason, "suppressed", r.suppressed,
				"suppressed_elsewhere", r.elsewhere, "refused_total", r.n)
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
		if r, ok := c.t.outRefused.note(c.peer, err); ok {
			c.t.log.Warn("transport: connection to a peer refused in the TLS handshake",
				"peer", c.peer, "err", err, "reason", r.reason, "suppressed", r.suppressed,
				"suppressed_elsewhere", r.elsewhere, "refused_total", r.n)
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
		cfg.VerifyConnection = chainVerify(cfg.VerifyConnection, func(cs tls.ConnectionState) error { return verifyPeer(t.cfg.VerifyPeer, "", cs) })
	}
	return cfg
}

// peerTLS returns the TLS configuration of connections to addr, with
// VerifyPeer (if set) checking the peer after the configuration's own
// checks.
func (t *GRPC) peerTLS(addr string) *tls.Config {
	cfg := t.cfg.PeerTLS.Clone()
	if t.cfg.VerifyPeer != nil {
		cfg.VerifyConnection = chainVerify(cfg.VerifyConnection, func(cs tls.ConnectionState) error { return verifyPeer(t.cfg.VerifyPeer, addr, cs) })
	}
	return cfg
}

// verifyPeer calls check, marking its refusal as VerifyPeer's.
func verifyPeer(check func(string, tls.ConnectionState) error, addr string, cs tls.ConnectionState) error {
	if err := check(addr, cs); err != nil {
		return &peerRefusedError{err: err}
	}
	return nil
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
