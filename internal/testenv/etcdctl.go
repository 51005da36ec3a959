package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// etcdctlTimeout bounds one etcdctl run.
const etcdctlTimeout = 15 * time.Second

// EtcdctlFlags returns the global flags that point ./bin/etcdctl at the
// cluster as the helpers' own clients connect: every member's endpoint,
// and with [WithTLS] the CA and the admin certificate, with [WithAuth]
// root's credentials.
func (c *EtcdCluster) EtcdctlFlags() []string {
	flags := []string{"--endpoints", strings.Join(c.Endpoints(), ",")}
	if pki := c.cfg.pki; pki != nil {
		flags = append(flags, "--cacert", pki.CAFile(), "--cert", c.admin.CertFile, "--key", c.admin.KeyFile)
	}
	if c.cfg.auth {
		flags = append(flags, "--user", "root", "--password", c.rootPw)
	}
	return flags
}

// Etcdctl runs ./bin/etcdctl with [EtcdCluster.EtcdctlFlags] followed by
// args and returns its standard output; an exit status other than 0 is an
// error carrying its standard error. ETCDCTL_* variables of the
// environment are not passed on. At most 15 s.
func (c *EtcdCluster) Etcdctl(ctx context.Context, args ...string) (string, error) {
	bin, err := BinaryPath("etcdctl")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, etcdctlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(c.EtcdctlFlags(), args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCDCTL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("etcdctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// MustEtcdctl is [EtcdCluster.Etcdctl] failing t on error.
func (c *EtcdCluster) MustEtcdctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := c.Etcdctl(context.Background(), args...)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return out
}

// AddPrefixUser creates, through etcdctl, a role and a user both named
// user, the role granting perm ("read", "write" or "readwrite") on every
// key under prefix and nothing else:
//
//	etcdctl role add USER
//	etcdctl role grant-permission USER PERM PREFIX --prefix
//	etcdctl user add USER --new-user-password PASSWORD
//	etcdctl user grant-role USER USER
//
// These are the lines SECURITY.md gives operators. prefix for a shardhost
// namespace is "/{namespace}/", with both slashes.
func (c *EtcdCluster) AddPrefixUser(t testing.TB, user, password, prefix, perm string) {
	t.Helper()
	c.MustEtcdctl(t, "role", "add", user)
	c.MustEtcdctl(t, "role", "grant-permission", user, perm, prefix, "--prefix")
	c.MustEtcdctl(t, "user", "add", user, "--new-user-password", password)
	c.MustEtcdctl(t, "user", "grant-role", user, user)
}

// GatewayKeyspaces are the keyspaces a client-only runner (a gateway)
// reads, besides the cluster record: SECURITY.md's gateway role grants read
// on these and nothing else (not the entities' state).
var GatewayKeyspaces = []string{"runners/", "shards/", "handoffs/", "drains/"}

// AddGatewayUser creates, through etcdctl, a role and a user both named
// user, the role granting read on the keyspaces a gateway of namespace
// reads ([GatewayKeyspaces], each a prefix) and on its cluster record, and
// nothing else:
//
//	etcdctl role add USER
//	for ks in runners/ shards/ handoffs/ drains/; do
//	  etcdctl role grant-permission USER read /NAMESPACE/$ks --prefix
//	done
//	etcdctl role grant-permission USER read /NAMESPACE/cluster
//	etcdctl user add USER --new-user-password PASSWORD
//	etcdctl user grant-role USER USER
//
// These are the lines SECURITY.md gives operators for gateways.
func (c *EtcdCluster) AddGatewayUser(t testing.TB, user, password, namespace string) {
	t.Helper()
	c.MustEtcdctl(t, "role", "add", user)
	for _, ks := range GatewayKeyspaces {
		c.MustEtcdctl(t, "role", "grant-permission", user, "read", "/"+namespace+"/"+ks, "--prefix")
	}
	c.MustEtcdctl(t, "role", "grant-permission", user, "read", "/"+namespace+"/cluster")
	c.MustEtcdctl(t, "user", "add", user, "--new-user-password", password)
	c.MustEtcdctl(t, "user", "grant-role", user, user)
}
