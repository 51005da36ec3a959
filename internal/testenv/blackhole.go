package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Blackhole is a loopback TCP listener that accepts connections and never
// answers: a gRPC dial to it hangs in CONNECTING (no HTTP/2 settings ever
// come), as a dial to a crashed host's port can on a real network. It is
// closed, with every connection it accepted, when the test ends.
type Blackhole struct {
	lis      net.Listener
	accepted chan struct{}
	closed   chan time.Time
}

// StartBlackhole starts a Blackhole on a free loopback port.
func StartBlackhole(t testing.TB) *Blackhole {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &Blackhole{lis: lis, accepted: make(chan struct{}, 64), closed: make(chan time.Time, 64)}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			b.accepted <- struct{}{}
			wg.Go(func() {
				_, _ = io.Copy(io.Discard, c) // never answers, until the client gives up
				b.closed <- time.Now()
			})
		}
	})
	t.Cleanup(func() {
		_ = lis.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return b
}

// Addr is the listener's host:port.
func (b *Blackhole) Addr() string { return b.lis.Addr().String() }

// Accepted receives one value per connection accepted (up to 64 unread).
func (b *Blackhole) Accepted() <-chan struct{} { return b.accepted }

// Closed receives, per connection, the instant its client closed it (up
// to 64 unread).
func (b *Blackhole) Closed() <-chan time.Time { return b.closed }
