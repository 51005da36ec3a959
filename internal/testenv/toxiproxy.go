package testenv

import (
	"context"
	"errors"
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
	SkipIfShort(t, "starts toxiproxy")
	onFailureRealTime(t)
	start := time.Now()
	x, err := launchToxiproxy(t.TempDir(), t.Logf)
	if x != nil {
		t.Cleanup(func() { x.cleanup(t) })
	}
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Logf("testenv: toxiproxy ready at %s in %v", x.addr, time.Since(start).Round(time.Millisecond))
	return x
}

// LaunchToxiproxy is [StartToxiproxy] for programs that are not tests: its
// log goes to dir, and the caller stops it with [Toxiproxy.Close].
func LaunchToxiproxy(dir string) (*Toxiproxy, error) {
	x, err := launchToxiproxy(dir, nil)
	if err != nil {
		if x != nil {
			_ = x.Close()
		}
		return nil, err
	}
	return x, nil
}

// launchToxiproxy starts the server with its log in dir. On error it
// returns the Toxiproxy to clean up, if a process was started.
func launchToxiproxy(dir string, logf func(string, ...any)) (*Toxiproxy, error) {
	bin, err := BinaryPath("toxiproxy-server")
	if err != nil {
		return nil, err
	}
	x := &Toxiproxy{logPath: filepath.Join(dir, "toxiproxy.log")}
	const attempts = 3
	for attempt := 1; ; attempt++ {
		port, err := freePorts(1)
		if err != nil {
			return x, fmt.Errorf("testenv: toxiproxy: free port: %w", err)
		}
		x.addr = hostPort(port)
		err = x.start(bin, port)
		if err == nil {
			break
		}
		if x.proc != nil {
			_ = x.proc.kill()
		}
		if !logContains(x.logPath, "address already in use") || attempt == attempts {
			return x, fmt.Errorf("testenv: start toxiproxy (attempt %d): %w\ntoxiproxy log tail:\n%s", attempt, err, logTail(x.logPath))
		}
		if logf != nil {
			logf("testenv: toxiproxy port taken by another process, retrying: %v", err)
		}
	}
	x.client = toxiproxy.NewClient(x.addr)
	return x, nil
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
	return poll(ctx, p, func(ctx context.Context) error { return httpOK(ctx, plainProbe, url) })
}

func (x *Toxiproxy) cleanup(t testing.TB) {
	if err := x.Close(); err != nil {
		t.Errorf("%v", err)
	}
	if t.Failed() {
		t.Logf("testenv: toxiproxy log tail (test failed, %s):\n%s", x.logPath, logTail(x.logPath))
	}
}

// Close stops the server (its proxies with it) and waits for it to exit:
// how the caller of [LaunchToxiproxy] stops it.
func (x *Toxiproxy) Close() error {
	if x.proc != nil {
		if err := x.proc.stop(stopGrace); err != nil {
			return fmt.Errorf("testenv: stop toxiproxy: %w", err)
		}
	}
	// The API client uses http.DefaultTransport; drop its now dead
	// keep-alive connections so their goroutines end promptly.
	if tr, ok := http.DefaultTransport.(*http.Transport); ok {
		tr.CloseIdleConnections()
	}
	return nil
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
	p, err := x.NewProxy(name, upstream)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if x.proc.exited() {
			return
		}
		if err := p.raw.Delete(); err != nil {
			t.Errorf("testenv: delete proxy %q: %v", name, err)
		}
	})
	return p
}

// NewProxy is [Toxiproxy.Proxy] for programs that are not tests: the proxy
// lives until the server stops.
func (x *Toxiproxy) NewProxy(name, upstream string) (*Proxy, error) {
	// Port 0: toxiproxy binds the listener itself and reports the port, so
	// no other process can take it in between.
	raw, err := x.client.CreateProxy(name, "127.0.0.1:0", upstream)
	if err != nil {
		return nil, fmt.Errorf("testenv: create proxy %q -> %s: %w", name, upstream, err)
	}
	_, portStr, err := net.SplitHostPort(raw.Listen)
	if err != nil {
		return nil, fmt.Errorf("testenv: proxy %q listens on %q: %w", name, raw.Listen, err)
	}
	var port int
	if _, err := fmt.Sscan(portStr, &port); err != nil || port == 0 {
		return nil, fmt.Errorf("testenv: proxy %q listens on %q", name, raw.Listen)
	}
	reservePort(port)
	return &Proxy{raw: raw, addr: hostPort(port)}, nil
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
func (p *Proxy) Blackhole(t testing.TB) { t.Helper(); must(t, p.SetBlackhole()) }

// SetBlackhole is [Proxy.Blackhole] returning an error.
func (p *Proxy) SetBlackhole() error {
	attrs := toxiproxy.Attributes{"timeout": 0}
	return errors.Join(p.setToxic(toxicBlackholeUp, "timeout", "upstream", attrs),
		p.setToxic(toxicBlackholeDown, "timeout", "downstream", attrs))
}

// Latency delays all data from upstream to the client (downstream) by d,
// so each request-response round trip takes at least d longer. Calling it
// again replaces the delay.
func (p *Proxy) Latency(t testing.TB, d time.Duration) { t.Helper(); must(t, p.SetLatency(d)) }

// SetLatency is [Proxy.Latency] returning an error.
func (p *Proxy) SetLatency(d time.Duration) error {
	return p.setToxic(toxicLatency, "latency", "downstream", toxiproxy.Attributes{"latency": d.Milliseconds(), "jitter": 0})
}

// ResetPeer resets (TCP RST) every connection through the proxy as soon as
// data flows in either direction, until Clear.
func (p *Proxy) ResetPeer(t testing.TB) { t.Helper(); must(t, p.SetResetPeer()) }

// SetResetPeer is [Proxy.ResetPeer] returning an error.
func (p *Proxy) SetResetPeer() error {
	attrs := toxiproxy.Attributes{"timeout": 0}
	return errors.Join(p.setToxic(toxicResetUp, "reset_peer", "upstream", attrs),
		p.setToxic(toxicResetDown, "reset_peer", "downstream", attrs))
}

// Clear removes all toxics from the proxy, the helpers' and any others.
func (p *Proxy) Clear(t testing.TB) { t.Helper(); must(t, p.RemoveToxics()) }

// RemoveToxics is [Proxy.Clear] returning an error. Removing a latency
// toxic waits for the data it holds; when that outlasts toxiproxy's API
// timeout the call fails although the removal goes on, so it checks again
// (for up to toxicRemoveWait) until no toxic is left. A removal that stays
// stuck (toxiproxy waits on a link whose peer stopped reading: a DELETE
// was seen answering 503 after 25 s) is freed by closing the proxy's
// connections (Disable, then Enable on the same address) — clients see a
// reset, as when the network heals under them.
func (p *Proxy) RemoveToxics() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	deadline := time.Now().Add(toxicRemoveWait)
	reset := false
	for {
		toxics, err := p.raw.Toxics()
		if err == nil && len(toxics) == 0 {
			return nil
		}
		if err == nil {
			for _, tx := range toxics {
				if err = p.raw.RemoveToxic(tx.Name); err != nil {
					err = fmt.Errorf("remove toxic %q: %w", tx.Name, err)
					break
				}
			}
			if err == nil {
				return nil
			}
		}
		if !reset {
			reset = true
			deadline = time.Now().Add(toxicRemoveWait)
			if derr := p.raw.Disable(); derr == nil {
				if eerr := p.raw.Enable(); eerr != nil {
					return fmt.Errorf("testenv: proxy %q: enable after a stuck toxic removal (%w): %w", p.raw.Name, err, eerr)
				}
			}
			continue
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: proxy %q: %w", p.raw.Name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// toxicRemoveWait bounds RemoveToxics (twice: before and after it resets
// the proxy's connections).
const toxicRemoveWait = 20 * time.Second

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
func (p *Proxy) setToxic(name, typ, stream string, attrs toxiproxy.Attributes) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	toxics, err := p.raw.Toxics()
	if err != nil {
		return fmt.Errorf("testenv: proxy %q: list toxics: %w", p.raw.Name, err)
	}
	if slices.ContainsFunc(toxics, func(tx toxiproxy.Toxic) bool { return tx.Name == name }) {
		_, err = p.raw.UpdateToxic(name, 1, attrs)
	} else {
		_, err = p.raw.AddToxic(name, typ, stream, 1, attrs)
	}
	if err != nil {
		return fmt.Errorf("testenv: proxy %q: toxic %s %s: %w", p.raw.Name, typ, name, err)
	}
	return nil
}

// must fails t on err.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%v", err)
	}
}
