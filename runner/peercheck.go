package runner

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"slices"
)

// Config.RequireClusterPeers: the names a peer's certificate must carry,
// checked against the runners this runner sees registered.

// peerCheck returns the transport's VerifyPeer for
// Config.RequireClusterPeers, or nil when it is off.
func (r *Runner) peerCheck() func(addr string, cs tls.ConnectionState) error {
	if !r.cfg.RequireClusterPeers {
		return nil
	}
	return r.verifyPeer
}

// verifyPeer accepts an incoming peer (addr "") whose certificate names a
// registered runner or one of Config.ClientPeerNames, and a peer dialed at
// addr whose certificate names the runner registered at addr.
func (r *Runner) verifyPeer(addr string, cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("runner %s: RequireClusterPeers: the peer presented no certificate", r.cfg.ID)
	}
	names := certNames(cs.PeerCertificates[0])
	if addr == "" {
		for _, n := range names {
			if slices.Contains(r.cfg.ClientPeerNames, n) {
				return nil
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if addr == "" {
		for _, n := range names {
			if _, ok := r.view.members[n]; ok {
				return nil
			}
		}
		return fmt.Errorf("runner %s: RequireClusterPeers: the client's certificate names %q: no registered runner and none of ClientPeerNames", r.cfg.ID, names)
	}
	var at []string
	for id, m := range r.view.members {
		if m.Address != addr {
			continue
		}
		if slices.Contains(names, id) {
			return nil
		}
		at = append(at, id)
	}
	if len(at) == 0 {
		return fmt.Errorf("runner %s: RequireClusterPeers: no registered runner has the address %s (certificate names %q)", r.cfg.ID, addr, names)
	}
	return fmt.Errorf("runner %s: RequireClusterPeers: the certificate of %s names %q, not the runner registered there (%q)", r.cfg.ID, addr, names, at)
}

// certNames returns the names a certificate gives its holder: its DNS
// subject alternative names and its URI ones (as strings).
func certNames(c *x509.Certificate) []string {
	names := slices.Clone(c.DNSNames)
	for _, u := range c.URIs {
		names = append(names, u.String())
	}
	return names
}
