package debugpage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Fetching the peers' states, and the rule that keeps the operator's
// credentials where the operator sent them:
//
//   - Config.PeerURL, when set, alone decides each runner's URL; the
//     operator's Config.HTTPClient fetches those.
//   - Without PeerURL, the URLs are the ones the runner records publish,
//     which whoever may write the namespace can choose: they are fetched
//     by publishedClient, which carries no credentials, and one that
//     carries credentials itself (user:password@, refused by runners at
//     start) is neither fetched nor shown.
//   - Neither client follows a redirect to another scheme or host, nor to
//     a URL with credentials.

// peerURL settles the URL of runner r (r.URL: the published one, as
// build set it; shown without credentials) and returns the URL to fetch
// with the client that fetches it, or why it is not fetched.
func (h *handler) peerURL(r *Runner) (target string, client *http.Client, refused string) {
	if h.cfg.PeerURL != nil {
		target = h.cfg.PeerURL(r.ID)
		r.URL = withoutCredentials(target)
		return target, h.cfg.HTTPClient, ""
	}
	if r.URL == "" {
		return "", nil, ""
	}
	if shown := withoutCredentials(r.URL); shown != r.URL {
		r.URL = shown
		return "", nil, "not fetched: the URL its record publishes carries credentials (user:password@), which the page neither shows nor uses; " +
			"protect the pages with your middleware and give DebugConfig.HTTPClient the credentials, with DebugConfig.PeerURL"
	}
	return r.URL, h.published, ""
}

// withoutCredentials returns u without its user information, if it parses.
func withoutCredentials(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
		return u
	}
	p.User = nil
	return p.String()
}

// publishedTransport carries the fetches of published URLs: the proxy
// settings of the environment, nothing of the program's own transports.
var publishedTransport = &http.Transport{
	Proxy:                 http.ProxyFromEnvironment,
	DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	ForceAttemptHTTP2:     true,
	MaxIdleConns:          100,
	IdleConnTimeout:       90 * time.Second,
	TLSHandshakeTimeout:   10 * time.Second,
	ExpectContinueTimeout: time.Second,
}

// publishedClient returns the client that fetches published URLs: no
// cookies, no credentials, redirects within the URL's scheme and host.
func publishedClient(timeout time.Duration) *http.Client {
	return &http.Client{Transport: publishedTransport, Timeout: timeout, CheckRedirect: sameOrigin(nil)}
}

// errRedirectRefused: a peer's page redirected elsewhere than its own
// scheme and host, or to a URL with credentials.
var errRedirectRefused = errors.New("redirect refused")

// sameOrigin returns a CheckRedirect that refuses a redirect to another
// scheme or host than the first request's, or to a URL with credentials,
// then applies next (nil: the standard limit of 10 redirects).
func sameOrigin(next func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		first := via[0].URL
		switch {
		case req.URL.User != nil:
			return fmt.Errorf("%w: to a URL with credentials", errRedirectRefused)
		case req.URL.Scheme != first.Scheme || !strings.EqualFold(req.URL.Host, first.Host):
			return fmt.Errorf("%w: to %s://%s, a peer's page may redirect within %s://%s only",
				errRedirectRefused, req.URL.Scheme, req.URL.Host, first.Scheme, first.Host)
		case next != nil:
			return next(req, via)
		case len(via) >= 10:
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
}

// maxPeerAnswer bounds what is read of a peer's answer: a runner's own
// state (?part=self) is a few KB; a version that sends its whole state
// sends its shard map too (about 200 KB at 65 536 shards).
const maxPeerAnswer = 4 << 20

// fetchPeer returns the state runner id reports at its debug URL, fetched
// with client, or why it has none.
func (h *handler) fetchPeer(ctx context.Context, client *http.Client, id, incarnation, base string) (*Self, string) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Sprintf("bad URL %q: %v", withoutCredentials(base), err)
	}
	q := u.Query()
	q.Set("format", "json")
	q.Set("peers", "0")   // understood by every version
	q.Set("part", "self") // skips the shard map where understood
	u.RawQuery = q.Encode()
	ctx, cancel := context.WithTimeout(ctx, h.cfg.PeerTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err.Error()
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, "unreachable: " + err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg := "unreachable: " + resp.Status
		if client == h.published && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
			msg += " (a URL a runner publishes is fetched without credentials: give DebugConfig.PeerURL, whose URLs DebugConfig.HTTPClient fetches)"
		}
		return nil, msg
	}
	var st State
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxPeerAnswer)).Decode(&st); err != nil {
		return nil, "bad answer: " + err.Error()
	}
	switch {
	case st.Schema != Schema:
		return nil, fmt.Sprintf("bad answer: schema %q, want %q", st.Schema, Schema)
	case st.Self.ID != id:
		return nil, fmt.Sprintf("%s serves runner %q", withoutCredentials(base), st.Self.ID)
	case st.Self.Incarnation != incarnation:
		return &st.Self, "another incarnation answers (restarted?)"
	}
	return &st.Self, ""
}
