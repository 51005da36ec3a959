package transport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
)

// TestHandshakeLogPerPeerAndReason: refused handshakes are logged once
// per handshakeLogEvery per peer host and kind of reason, never hiding
// another peer's or another reason's; the next line of a pair says how
// many of its refusals went unlogged. Beyond handshakeLogKeys pairs, one
// line a minute speaks for the untracked ones, and the next line of any
// pair tells how many of theirs went unlogged.
func TestHandshakeLogPerPeerAndReason(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		junk := tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}
		stranger := &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}
		var h handshakeLog
		check := func(what, peer string, err error, logged bool, want refusalNote) {
			t.Helper()
			got, ok := h.note(peer, err)
			want.n = got.n
			if ok != logged || (ok && got != want) {
				t.Errorf("%s: logged %v %+v; want logged %v %+v", what, ok, got, logged, want)
			}
		}
		check("junk from A", "10.0.0.1:40000", junk, true, refusalNote{reason: "not TLS"})
		check("more junk from A, another port", "10.0.0.1:40001", junk, false, refusalNote{})
		check("more junk from A", "10.0.0.1:40002", junk, false, refusalNote{})
		check("a certificate of another CA from A", "10.0.0.1:40003", stranger, true, refusalNote{reason: "unknown authority"})
		check("a refusal of VerifyPeer from A", "10.0.0.1:40004", &peerRefusedError{errors.New("names no runner")}, true, refusalNote{reason: "peer check"})
		check("junk from B", "10.0.0.2:40000", junk, true, refusalNote{reason: "not TLS"})
		time.Sleep(handshakeLogEvery)
		check("junk from A a minute later", "10.0.0.1:40005", junk, true, refusalNote{reason: "not TLS", suppressed: 2})

		// A flood from many hosts within a minute: bounded pairs and lines.
		time.Sleep(handshakeLogEvery)
		const hosts = 4 * handshakeLogKeys
		lines := 0
		for i := range hosts {
			if _, logged := h.note(fmt.Sprintf("10.1.%d.%d:1", i/256, i%256), junk); logged {
				lines++
			}
		}
		if lines != handshakeLogKeys+1 {
			t.Errorf("%d hosts' junk within a minute logged %d lines, want %d (one per pair tracked, one for the others)", hosts, lines, handshakeLogKeys+1)
		}
		if n := len(h.keys); n > handshakeLogKeys {
			t.Errorf("%d pairs tracked, want at most %d", n, handshakeLogKeys)
		}
		// The next line, of any pair, tells the flood's unlogged refusals.
		check("junk from B during the flood's minute", "10.0.0.2:40001", junk, false, refusalNote{})
		time.Sleep(handshakeLogEvery)
		check("a stranger from C after the flood", "10.0.0.3:1", stranger, true,
			refusalNote{reason: "unknown authority", elsewhere: hosts - handshakeLogKeys - 1 + 1}) // + B's: untracked, the table full
		check("junk from D", "10.0.0.4:1", junk, true, refusalNote{reason: "not TLS"})
	})
}

// TestJunkHandshakeHidesNoOtherRefusal: a peer that sends junk instead of
// a TLS handshake is logged, and a peer of another CA refused right after
// it (within the minute, from the same host) is logged too, with its own
// reason; more junk is counted, not logged.
func TestJunkHandshakeHidesNoOtherRefusal(t *testing.T) {
	pki, other := testenv.NewPKI(t, "cluster"), testenv.NewPKI(t, "other")
	log := &testenv.WarnLines{}
	g := NewGRPC(GRPCConfig{ListenAddr: "127.0.0.1:0", TLS: pki.ServerTLS(pki.MustIssue(t, "a")), Logger: slog.New(log)})
	addr, err := g.Listen(echoHandler{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close(0)
	junk := func() {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.Copy(io.Discard, c) // until the server closes it
	}
	junk()
	waitUntil(t, 5*time.Second, "the junk handshake logged", func() bool { return len(log.Find("refused in the TLS handshake")) == 1 })

	stranger := other.MustIssue(t, "stranger")
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pki.Pool(), MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &stranger.TLS, nil }})
	if err == nil {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.Read(make([]byte, 1)) // the server's verdict
		c.Close()
	}
	waitUntil(t, 5*time.Second, "the stranger's refusal logged", func() bool { return len(log.Find("certificate signed by unknown authority")) == 1 })
	junk()
	time.Sleep(100 * time.Millisecond)
	if got := log.Find("refused in the TLS handshake"); len(got) != 2 || !strings.Contains(got[0], "reason=not TLS") {
		t.Errorf("WARN lines %q, want the first junk (reason not TLS) and the stranger's, the second junk counted only", got)
	}
}
