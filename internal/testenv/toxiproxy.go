package testenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"
)

// Toxiproxy is a toxiproxy server running as a child process on a loopback
// port, with a client for its HTTP API.
type Toxiproxy struct {
	addr    string
	logPath string
	client  *toxiproxy.Client
	proc    *process
}

const toxiproxyStartTimeout = 10 * time.Second

// StartToxiproxy starts bin/toxiproxy-server on a free 127.0.0.1 port and
// waits until its API answers. The server is stopped when t ends. Start-up is
// retried with a fresh port if another process took it.
func StartToxiproxy(t testing.TB) *Toxiproxy {
	t.Helper()
	bin := Binary(t, "toxiproxy-server")
	logPath := filepath.Join(t.TempDir(), "toxiproxy.log")
	x := &Toxiproxy{logPath: logPath}
	t.Cleanup(func() { x.cleanup(t) })

	start := time.Now()
	const attempts = 3
	for attempt := 1; ; attempt++ {
		port := FreePort(t)
		x.addr = hostPort(port)
		err := x.start(bin, port)
		if err == nil {
			break
		}
		if x.proc != nil {
			_ = x.proc.kill()
		}
		if !logContains(logPath, "address already in use") || attempt == attempts {
			t.Fatalf("testenv: start toxiproxy (attempt %d): %v\ntoxiproxy log tail:\n%s", attempt, err, logTail(logPath))
		}
		t.Logf("testenv: toxiproxy port taken by another process, retrying: %v", err)
	}
	x.client = toxiproxy.NewClient(x.addr)
	t.Logf("testenv: toxiproxy ready at %s in %v", x.addr, time.Since(start).Round(time.Millisecond))
	return x
}

func (x *Toxiproxy) start(bin string, port int) error {
	p, err := startProcess(bin, []string{"-host", "127.0.0.1", "-port", fmt.Sprint(port)}, x.logPath)
	if err != nil {
		return err
	}
	x.proc = p
	ctx, cancel := context.WithTimeout(context.Background(), toxiproxyStartTimeout)
	defer cancel()
	url := "http://" + x.addr + "/version"
	return poll(ctx, p, func(ctx context.Context) error { return httpOK(ctx, url) })
}

func (x *Toxiproxy) cleanup(t testing.TB) {
	if x.proc != nil {
		if err := x.proc.stop(stopGrace); err != nil {
			t.Errorf("testenv: stop toxiproxy: %v", err)
		}
	}
	// The API client uses http.DefaultTransport; drop its now dead
	// keep-alive connections so their goroutines end promptly.
	if tr, ok := http.DefaultTransport.(*http.Transport); ok {
		tr.CloseIdleConnections()
	}
	if t.Failed() {
		t.Logf("testenv: toxiproxy log tail (test failed, %s):\n%s", x.logPath, logTail(x.logPath))
	}
}

// Addr returns the address of the toxiproxy HTTP API, "127.0.0.1:port".
func (x *Toxiproxy) Addr() string { return x.addr }

// Client returns the raw API client, for toxics the helpers do not cover
// (bandwidth, slicer, limit_data, ...). Its calls time out after 30 s.
func (x *Toxiproxy) Client() *toxiproxy.Client { return x.client }

// Proxy creates a proxy named name that listens on a free 127.0.0.1 port and
// forwards to upstream (host:port), and deletes it when t ends.
func (x *Toxiproxy) Proxy(t testing.TB, name, upstream string) *Proxy {
	t.Helper()
	// Port 0: toxiproxy binds the listener itself and reports the port, so
	// no other process can take it in between.
	raw, err := x.client.CreateProxy(name, "127.0.0.1:0", upstream)
	if err != nil {
		t.Fatalf("testenv: create proxy %q -> %s: %v", name, upstream, err)
	}
	_, portStr, err := net.SplitHostPort(raw.Listen)
	if err != nil {
		t.Fatalf("testenv: proxy %q listens on %q: %v", name, raw.Listen, err)
	}
	var port int
	if _, err := fmt.Sscan(portStr, &port); err != nil || port == 0 {
		t.Fatalf("testenv: proxy %q listens on %q", name, raw.Listen)
	}
	reservePort(port)
	p := &Proxy{raw: raw, addr: hostPort(port)}
	t.Cleanup(func() {
		if x.proc.exited() {
			return
		}
		if err := raw.Delete(); err != nil {
			t.Errorf("testenv: delete proxy %q: %v", name, err)
		}
	})
	return p
}

// Proxy is one toxiproxy proxy in front of an upstream address. Its toxics
// apply to new and existing connections. The helpers' toxics have names
// starting with "testenv_".
type Proxy struct {
	mu   sync.Mutex // serializes Save calls on raw, which mutate it
	raw  *toxiproxy.Proxy
	addr string
}

// Toxic names used by the helpers.
const (
	toxicBlackholeUp   = "testenv_blackhole_up"
	toxicBlackholeDown = "testenv_blackhole_down"
	toxicLatency       = "testenv_latency"
	toxicResetUp       = "testenv_reset_up"
	toxicResetDown     = "testenv_reset_down"
)

// Addr returns the address clients connect to, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.addr }

// Name returns the proxy's name.
func (p *Proxy) Name() string { return p.raw.Name }

// Raw returns the underlying client proxy, for other toxics
// (Raw().AddToxic(...)). Do not call its methods concurrently with the
// helpers'.
func (p *Proxy) Raw() *toxiproxy.Proxy { return p.raw }

// Blackhole silently drops all data in both directions on new and existing
// connections (a "timeout" toxic with timeout 0 on both streams): calls hang
// until their own deadline, connections stay open. Removing it (Clear)
// closes the connections that were blackholed, so clients reconnect.
func (p *Proxy) Blackhole(t testing.TB) {
	t.Helper()
	attrs := toxiproxy.Attributes{"timeout": 0}
	p.setToxic(t, toxicBlackholeUp, "timeout", "upstream", attrs)
	p.setToxic(t, toxicBlackholeDown, "timeout", "downstream", attrs)
}

// Latency delays all data from upstream to the client (downstream) by d,
// so each request-response round trip takes at least d longer. Calling it
// again replaces the delay.
func (p *Proxy) Latency(t testing.TB, d time.Duration) {
	t.Helper()
	p.setToxic(t, toxicLatency, "latency", "downstream", toxiproxy.Attributes{"latency": d.Milliseconds(), "jitter": 0})
}

// ResetPeer resets (TCP RST) every connection through the proxy as soon as
// data flows in either direction, until Clear.
func (p *Proxy) ResetPeer(t testing.TB) {
	t.Helper()
	attrs := toxiproxy.Attributes{"timeout": 0}
	p.setToxic(t, toxicResetUp, "reset_peer", "upstream", attrs)
	p.setToxic(t, toxicResetDown, "reset_peer", "downstream", attrs)
}

// Clear removes all toxics from the proxy, the helpers' and any others.
func (p *Proxy) Clear(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	toxics, err := p.raw.Toxics()
	if err != nil {
		t.Fatalf("testenv: proxy %q: list toxics: %v", p.raw.Name, err)
	}
	for _, tx := range toxics {
		if err := p.raw.RemoveToxic(tx.Name); err != nil {
			t.Fatalf("testenv: proxy %q: remove toxic %q: %v", p.raw.Name, tx.Name, err)
		}
	}
}

// Disable closes all connections through the proxy and its listener: new
// connections are refused until Enable.
func (p *Proxy) Disable(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.raw.Disable(); err != nil {
		t.Fatalf("testenv: proxy %q: disable: %v", p.raw.Name, err)
	}
}

// Enable listens again on the same address after Disable.
func (p *Proxy) Enable(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.raw.Enable(); err != nil {
		t.Fatalf("testenv: proxy %q: enable: %v", p.raw.Name, err)
	}
}

// setToxic adds the toxic or, if one with that name exists, updates it.
func (p *Proxy) setToxic(t testing.TB, name, typ, stream string, attrs toxiproxy.Attributes) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	toxics, err := p.raw.Toxics()
	if err != nil {
		t.Fatalf("testenv: proxy %q: list toxics: %v", p.raw.Name, err)
	}
	if slices.ContainsFunc(toxics, func(tx toxiproxy.Toxic) bool { return tx.Name == name }) {
		_, err = p.raw.UpdateToxic(name, 1, attrs)
	} else {
		_, err = p.raw.AddToxic(name, typ, stream, 1, attrs)
	}
	if err != nil {
		t.Fatalf("testenv: proxy %q: toxic %s %s: %v", p.raw.Name, typ, name, err)
	}
}
