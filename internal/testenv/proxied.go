package testenv

import (
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ProxiedCluster is an etcd cluster with one toxiproxy proxy in front of
// each member, for clients that must see one member fail while the others
// work: a toxic on a member's proxy affects only the connections through
// it, and a killed or paused member behind its proxy looks to those clients
// like a crashed or frozen server. Observers that must not be affected use
// [EtcdCluster.Client] (direct connections).
type ProxiedCluster struct {
	*EtcdCluster
	Toxiproxy *Toxiproxy
	proxies   []*Proxy // by member index
}

// StartProxiedEtcdCluster starts an n-member cluster (as
// [StartEtcdCluster]), a toxiproxy server, and one proxy per member named
// "member-{i}". Everything is stopped when t ends.
func StartProxiedEtcdCluster(t testing.TB, n int, opts ...EtcdOption) *ProxiedCluster {
	t.Helper()
	c := StartEtcdCluster(t, n, opts...)
	tox := StartToxiproxy(t)
	pc := &ProxiedCluster{EtcdCluster: c, Toxiproxy: tox}
	for i, m := range c.members {
		pc.proxies = append(pc.proxies, tox.Proxy(t, fmt.Sprintf("member-%d", i), m.Endpoint()))
	}
	return pc
}

// Proxies returns the proxies in member order.
func (pc *ProxiedCluster) Proxies() []*Proxy { return append([]*Proxy(nil), pc.proxies...) }

// ProxyOf returns the proxy in front of member m (one of Members()).
func (pc *ProxiedCluster) ProxyOf(m *Etcd) *Proxy {
	for i, x := range pc.members {
		if x == m {
			return pc.proxies[i]
		}
	}
	panic(fmt.Sprintf("testenv: etcd %s is not a member of this cluster", m.Name()))
}

// ProxiedEndpoints returns the proxies' addresses in member order: the
// endpoints for clients under test.
func (pc *ProxiedCluster) ProxiedEndpoints() []string {
	eps := make([]string, len(pc.proxies))
	for i, p := range pc.proxies {
		eps[i] = p.Addr()
	}
	return eps
}

// ProxiedClient returns a new client for all proxied endpoints (with
// [EtcdClientConfig]), closed when t ends.
func (pc *ProxiedCluster) ProxiedClient(t testing.TB) *clientv3.Client {
	t.Helper()
	return NewEtcdClient(t, pc.ProxiedEndpoints()...)
}

// ClearAll removes every toxic from every proxy.
func (pc *ProxiedCluster) ClearAll(t testing.TB) {
	t.Helper()
	for _, p := range pc.proxies {
		p.Clear(t)
	}
}
