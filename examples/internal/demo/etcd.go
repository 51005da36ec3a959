package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Etcd is the etcd a demo runs on: a single-member etcd embedded in the
// process, listening on free loopback ports with its data in a temporary
// directory, or an existing one.
type Etcd struct {
	Endpoint   string   // host:port of its client URL
	Namespaces []string // the run's, in the order of OpenEtcd's suffixes

	e   *embed.Etcd // nil for an existing etcd
	dir string
}

// OpenEtcd returns the etcd at addr or, when addr is "", starts an
// embedded one and waits until it is ready (its logs are discarded unless
// verbose). It tells say which etcd the demo uses.
//
// The run's namespaces are prefix-suffix for each suffix, or prefix alone
// without suffixes. In an existing etcd, keys of other runs (checkpoints
// never expire) must not leak in: there the prefix gets the run's start
// time, prefix-<nanos>, and Close deletes the namespaces.
func OpenEtcd(addr string, verbose bool, say func(format string, args ...any), prefix string, suffixes ...string) (*Etcd, error) {
	if addr == "" {
		e, err := startEtcd(verbose)
		if err != nil {
			return nil, err
		}
		e.Namespaces = namespaces(prefix, suffixes)
		say("embedded etcd %s ready at %s", version.Version, e.Endpoint)
		return e, nil
	}
	e := &Etcd{Endpoint: addr, Namespaces: namespaces(fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()), suffixes)}
	ns := e.Namespaces
	list := fmt.Sprintf("namespace %q", ns[0])
	if last := len(ns) - 1; last > 0 {
		list = fmt.Sprintf("namespaces %q", ns[0])
		for _, n := range ns[1:last] {
			list += fmt.Sprintf(", %q", n)
		}
		list += fmt.Sprintf(" and %q", ns[last])
	}
	say("using etcd at %s, %s", addr, list)
	return e, nil
}

// namespaces returns prefix-suffix for each suffix, or prefix alone
// without suffixes.
func namespaces(prefix string, suffixes []string) []string {
	if len(suffixes) == 0 {
		return []string{prefix}
	}
	out := make([]string, len(suffixes))
	for i, s := range suffixes {
		out[i] = prefix + "-" + s
	}
	return out
}

// Close stops an embedded etcd and removes its data, or deletes the run's
// namespaces from an existing etcd.
func (e *Etcd) Close() {
	if e.e == nil {
		deleteNamespaces(e.Endpoint, e.Namespaces)
		return
	}
	e.e.Close()
	os.RemoveAll(e.dir)
}

// startEtcd starts an embedded etcd, trying up to three times.
func startEtcd(verbose bool) (*Etcd, error) {
	for attempt := 0; ; attempt++ { // a free port may be taken before etcd binds it
		e, err := tryEtcd(verbose)
		if err == nil || attempt == 2 {
			return e, err
		}
	}
}

func tryEtcd(verbose bool) (*Etcd, error) {
	dir, err := os.MkdirTemp("", "shardhost-demo-etcd-")
	if err != nil {
		return nil, err
	}
	clientURL, err1 := freeURL()
	peerURL, err2 := freeURL()
	if err := errors.Join(err1, err2); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = "demo"
	cfg.Dir = dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.LogLevel = "warn"
	if !verbose {
		// Even at level "error" a healthy start and stop log errors.
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	}
	ee, err := embed.StartEtcd(cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	e := &Etcd{Endpoint: clientURL.Host, e: ee, dir: dir}
	select {
	case <-ee.Server.ReadyNotify():
		return e, nil
	case err := <-ee.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, errors.New("embedded etcd not ready after 30s")
	}
}

func freeURL() (url.URL, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return url.URL{}, err
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}, nil
}

// deleteNamespaces removes the keys of namespaces from the etcd at
// endpoint, on a best-effort basis.
func deleteNamespaces(endpoint string, namespaces []string) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, ns := range namespaces {
		_, _ = cli.Delete(ctx, "/"+ns+"/", clientv3.WithPrefix())
	}
}
