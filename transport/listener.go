package transport

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// The transport server's connection limits (documented on
// Config.MaxConnections).
const (
	// serverHandshakeTimeout bounds a new connection's TLS and HTTP/2
	// handshake (grpc.ConnectionTimeout; gRPC's default is 120 s): a
	// connection that sends no preface is closed after it.
	serverHandshakeTimeout = 5 * time.Second
	// serverMaxConnectionIdle closes a connection without calls for this
	// long (peers reconnect when they next send).
	serverMaxConnectionIdle = 5 * time.Minute
	// serverPingTime and serverPingTimeout: the server pings a connection
	// silent for serverPingTime and closes it without an answer within
	// serverPingTimeout (a peer that vanished without closing).
	serverPingTime    = 30 * time.Second
	serverPingTimeout = 10 * time.Second
	// serverMinPingInterval: clients pinging more often are disconnected
	// (peers ping every 10 s).
	serverMinPingInterval = 5 * time.Second
)

// limitListener holds at most max connections open at once: gRPC has no
// such option. A connection accepted beyond it is closed at once (a peer
// sees a failed connection and retries; nothing waits in the backlog).
type limitListener struct {
	net.Listener
	max    int64
	open   atomic.Int64
	reject func(open int64) // called for each connection refused
}

func newLimitListener(l net.Listener, max int, reject func(open int64)) *limitListener {
	return &limitListener{Listener: l, max: int64(max), reject: reject}
}

// Accept returns the next connection within the limit.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if n := l.open.Add(1); n > l.max {
			l.open.Add(-1)
			_ = c.Close()
			l.reject(n - 1)
			continue
		}
		return &limitedConn{Conn: c, l: l}, nil
	}
}

// Open returns the number of connections held now.
func (l *limitListener) Open() int64 { return l.open.Load() }

// limitedConn gives its slot back when closed (once).
type limitedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}
