//go:build linux

package main

import (
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
)

// TestSecureClusterProcesses runs the example as `make demo-cluster-secure`
// does: etcd with client TLS and authentication, two runner processes
// logged in as a user whose role grants readwrite on /demo/ only, a
// gateway logged in as one granted read on what a gateway reads only
// (SECURITY.md's role), mutual TLS between them with RequireClusterPeers
// under a CA of its own (not etcd's); traffic flows to both runners, and
// shardhostctl reads the cluster with etcdctl's TLS flags.
func TestSecureClusterProcesses(t *testing.T) {
	const shards = 256
	pki := testenv.NewPKI(t, "demo-etcd")               // etcd and its clients
	transportPKI := testenv.NewPKI(t, "demo-transport") // the runners' transport
	etcd := testenv.StartEtcd(t, testenv.WithTLS(pki), testenv.WithAuth())
	etcd.Cluster().AddPrefixUser(t, "demo", "demo-password", "/demo/", "readwrite")
	etcd.Cluster().AddGatewayUser(t, "demo-gateway", "gateway-password", "demo")
	dir := t.TempDir()
	bin := goBuild(t, "cluster", ".")
	ctlBin := goBuild(t, "shardhostctl", "github.com/shardhost/shardhost/cmd/shardhostctl")

	ids := []string{"runner-1", "runner-2"}
	debug := map[string]string{}
	for _, id := range append([]string{"gateway"}, ids...) {
		debug[id] = "http://" + testenv.FreeAddr(t) + DebugPath // a runner publishes its own in its record
	}
	addr := func(id string) string { return strings.TrimSuffix(strings.TrimPrefix(debug[id], "http://"), DebugPath) }
	args := func(id, user string) []string {
		c := pki.MustIssue(t, id)
		tc := transportPKI.MustIssue(t, id) // DNS name: the runner ID
		return []string{"-id", id, "-debug", addr(id), "-etcd", etcd.Endpoint(), "-namespace", "demo",
			"-shards", strconv.Itoa(shards), "-ttl", "5s",
			"-cacert", pki.CAFile(), "-cert", c.CertFile, "-key", c.KeyFile, "-user", user,
			"-tls-ca", transportPKI.CAFile(), "-tls-cert", tc.CertFile, "-tls-key", tc.KeyFile,
			"-require-cluster-peers", "-client-peers", "gateway"}
	}
	t.Setenv(envPassword, "demo-password")
	for _, id := range ids {
		start(t, dir, bin, id, append([]string{"-role", "runner"}, args(id, "demo")...)...)
	}
	t.Setenv(envPassword, "gateway-password")
	start(t, dir, bin, "gateway", append([]string{"-role", "gateway", "-rate", "200", "-report", "500ms"}, args("gateway", "demo-gateway")...)...)

	waitState(t, debug["gateway"], 60*time.Second, "2 attached runners owning every shard, seen by the gateway", healthy(ids...))
	waitState(t, debug["runner-1"], 30*time.Second, "traffic handled on every runner", func(st runner.DebugState) bool {
		for _, r := range st.Runners {
			if r.State == nil || r.State.Messages == 0 {
				return false
			}
		}
		return healthy(ids...)(st)
	})

	ctl := pki.MustIssue(t, "shardhostctl")
	cmd := exec.Command(ctlBin, "-endpoints", etcd.Endpoint(), "-namespace", "demo", // the shard count from the cluster record
		"-cacert", pki.CAFile(), "-cert", ctl.CertFile, "-key", ctl.KeyFile, "-user", "demo-gateway", "status", "-json")
	cmd.Env = append(cmd.Environ(), "SHARDHOST_ETCD_PASSWORD=gateway-password")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("shardhostctl status: %v\n%s", err, out)
	}
	var status struct {
		Runners []struct{ ID string }
		Owned   int
	}
	if err := json.Unmarshal(out, &status); err != nil {
		t.Fatalf("shardhostctl status -json: %v\n%s", err, out)
	}
	if len(status.Runners) != 2 || status.Owned != shards {
		t.Errorf("shardhostctl status = %+v, want 2 runners owning all %d shards", status, shards)
	}
}
