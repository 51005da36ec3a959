//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
)

// substituteFlags returns args with the values of the flags in values
// replaced (-name=value form, as deploy/'s manifests write them); every
// flag of values must be in args.
func substituteFlags(t *testing.T, args []string, values map[string]string) []string {
	t.Helper()
	out := make([]string, len(args))
	seen := map[string]bool{}
	for i, a := range args {
		out[i] = a
		name, _, ok := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		if v, sub := values[name]; ok && sub {
			out[i] = "-" + name + "=" + v
			seen[name] = true
		}
	}
	for name := range values {
		if !seen[name] {
			t.Fatalf("the manifest's command line %q has no -%s to substitute", args, name)
		}
	}
	return out
}

// readiness asks a process's readiness handler: its status code (0 when
// it did not answer) and its body.
func readiness(client *http.Client, url string) (int, runner.HealthCheck) {
	var hc runner.HealthCheck
	resp, err := client.Get(url)
	if err != nil {
		return 0, hc
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &hc)
	return resp.StatusCode, hc
}

// waitReady polls url until it answers 200, as a readiness probe would;
// it returns the not-ready answers seen before (phases).
func waitReady(t *testing.T, client *http.Client, url string, d time.Duration, what string) []string {
	t.Helper()
	var notReady []string
	for p := testenv.NewPatience(d); ; p.Sleep(50 * time.Millisecond) {
		code, hc := readiness(client, url)
		if code == http.StatusOK {
			return notReady
		}
		if code == http.StatusServiceUnavailable {
			if len(notReady) == 0 || notReady[len(notReady)-1] != hc.Phase {
				notReady = append(notReady, hc.Phase)
			}
		}
		if p.Over() {
			t.Fatalf("%s not ready after %v (last: %d %+v)", what, p, code, hc)
		}
	}
}

// sender sends POST IncPath through the gateway's API one request at a
// time, over a few hundred counters, and counts the answers. Hold mu to
// keep a request from being in flight.
type sender struct {
	mu       sync.Mutex
	ok       int
	failures []string
	stop     chan struct{}
	done     chan struct{}
}

func startSender(client *http.Client, api string) *sender {
	s := &sender{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for i := 0; ; i++ {
			select {
			case <-s.stop:
				return
			default:
			}
			s.mu.Lock()
			url := fmt.Sprintf("%s/counters/c-%d/inc", api, i%300)
			resp, err := client.Post(url, "application/json", nil)
			var body []byte
			if err == nil {
				body, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			switch {
			case err != nil:
				s.failures = append(s.failures, fmt.Sprintf("%s: %v", url, err))
			case resp.StatusCode != http.StatusOK:
				s.failures = append(s.failures, fmt.Sprintf("%s: %s %s", url, resp.Status, strings.TrimSpace(string(body))))
			default:
				s.ok++
			}
			s.mu.Unlock()
		}
	}()
	return s
}

// answered returns how many requests succeeded so far, and the failures.
func (s *sender) answered() (int, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ok, append([]string(nil), s.failures...)
}

// waitAnswers waits until the sender has had n more answers than before
// (an event: it made progress meanwhile).
func (s *sender) waitAnswers(t *testing.T, before, n int) {
	t.Helper()
	for p := testenv.NewPatience(time.Minute); ; p.Sleep(20 * time.Millisecond) {
		if ok, failures := s.answered(); ok >= before+n || len(failures) > 0 {
			return
		}
		if p.Over() {
			t.Fatalf("the sender got no answer for %v", p)
		}
	}
}

// TestManifestProcessesRollAndCrashWithoutLosingRequests runs
// examples/cluster exactly as deploy/kubernetes's command lines say (3
// runners named as the StatefulSet's pods + a gateway; their addresses,
// certificates and etcd endpoint substituted by the test's: loopback, free
// ports, a real etcd with client TLS whose roles deploy/kubernetes's
// etcd-roles Job sets up) and follows their readiness like Kubernetes
// would: ready before the traffic starts; a SIGTERM rolling restart one
// runner at a time, each not ready from the moment it stops until it
// exits, then restarted and waited for until ready again; then a SIGKILL
// of one runner, restarted at once: not ready while it waits for its
// predecessor's lease, ready after. Every request the test sends through
// the gateway's API meanwhile is answered (a request in flight to the
// killed process itself is not sent: nothing can answer it for sure; one
// sent right after the kill, on the gateway's connection to the dead
// process before the gateway read its close, may fail "maybe delivered":
// crashRace).
func TestManifestProcessesRollAndCrashWithoutLosingRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes and etcd")
	}
	ws := workloads(t, loadManifests(t))
	bin := goBuild(t, "cluster", ".")
	dir := t.TempDir()
	pki := testenv.NewPKI(t, "deploy-etcd")
	transportPKI := testenv.NewPKI(t, "deploy-transport")
	etcd := testenv.StartEtcd(t, testenv.WithTLS(pki), testenv.WithAuth())
	runRolesJob(t, pki, etcd)

	etcdCert := func(name, user string) testenv.Cert { return pki.MustIssue(t, name, testenv.WithCommonName(user)) }
	runnerEtcd, gatewayEtcd := etcdCert("runner-etcd", "shardhost-prod"), etcdCert("gateway-etcd", "shardhost-prod-gateway")
	transport := transportPKI.MustIssue(t, "transport")
	certs := func(etcdCert testenv.Cert) map[string]string {
		return map[string]string{
			"etcd": etcd.Endpoint(), "cacert": pki.CAFile(), "cert": etcdCert.CertFile, "key": etcdCert.KeyFile,
			"tls-ca": transportPKI.CAFile(), "tls-cert": transport.CertFile, "tls-key": transport.KeyFile,
		}
	}
	client := &http.Client{Timeout: 30 * time.Second}
	probe := &http.Client{Timeout: 2 * time.Second}

	type process struct {
		id, ready string
		args      []string
		p         *proc
	}
	rw := ws["runner"]
	rc := rw.programContainer(t)
	var runners []*process
	for _, pod := range rw.pods {
		args, _ := rw.podArgs(t, rc, pod)
		transportAddr, debugAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
		values := certs(runnerEtcd)
		values["listen"], values["address"] = transportAddr, transportAddr
		values["debug"], values["debug-url"] = debugAddr, "http://"+debugAddr+DebugPath
		r := &process{id: pod, ready: "http://" + debugAddr + ReadinessPath, args: substituteFlags(t, args, values)}
		r.p = start(t, dir, bin, pod, r.args...)
		runners = append(runners, r)
	}
	gw := ws["gateway"]
	gc := gw.programContainer(t)
	gargs, _ := gw.podArgs(t, gc, gw.pods[0])
	gDebug, gAPI := testenv.FreeAddr(t), testenv.FreeAddr(t)
	values := certs(gatewayEtcd)
	values["debug"], values["api"] = gDebug, gAPI
	start(t, dir, bin, "gateway", substituteFlags(t, gargs, values)...)

	for _, r := range runners {
		waitReady(t, probe, r.ready, 2*time.Minute, r.id)
	}
	waitReady(t, probe, "http://"+gDebug+ReadinessPath, time.Minute, "gateway")
	s := startSender(client, "http://"+gAPI)
	defer func() {
		select {
		case <-s.stop:
		default:
			close(s.stop)
		}
		<-s.done
	}()
	s.waitAnswers(t, 0, 1)

	// The rolling update: the highest ordinal first, one at a time, each
	// waited for until ready.
	for i := len(runners) - 1; i >= 0; i-- {
		r := runners[i]
		before, _ := s.answered()
		if err := r.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		stopping, readyAgain := followStop(probe, r.ready, r.p.done)
		if readyAgain != "" {
			t.Errorf("%s: ready again while stopping (%s)", r.id, readyAgain)
		}
		if !slices.ContainsFunc(stopping, func(phase string) bool { return phase != "no answer" }) {
			t.Errorf("%s: never answered not ready between SIGTERM and its exit (seen: %v)", r.id, stopping)
		}
		if code := r.p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("%s: exit status %d after SIGTERM, want 0 (a graceful stop)", r.id, code)
		}
		r.p = start(t, dir, bin, r.id, r.args...)
		notReady := waitReady(t, probe, r.ready, 2*time.Minute, r.id+" restarted")
		t.Logf("%s: SIGTERM: not ready while %v; restarted: not ready while %v, then ready", r.id, stopping, notReady)
		s.waitAnswers(t, before, 1)
	}

	// A crash: SIGKILL with no request in flight, restarted at once (the
	// kubelet restarts the container): it waits for its predecessor's
	// lease, not ready meanwhile, then takes its shards back.
	r := runners[1]
	s.mu.Lock()
	r.p.kill(t)
	killedAt := len(s.failures)
	s.mu.Unlock()
	before, _ := s.answered()
	r.p = start(t, dir, bin, r.id, r.args...)
	notReady := waitReady(t, probe, r.ready, 2*time.Minute, r.id+" restarted after SIGKILL")
	_, failures := s.answered()
	crashRace := crashRace(failures, killedAt, r.id)
	if len(notReady) == 0 || notReady[0] != "starting" {
		t.Errorf("%s restarted after SIGKILL: not ready while %v, want starting first (the wait for its predecessor's lease)", r.id, notReady)
	}
	t.Logf("%s: SIGKILL, restarted: not ready while %v, then ready", r.id, notReady)
	s.waitAnswers(t, before, 1)

	ids := make([]string, len(runners))
	for i, r := range runners {
		ids[i] = r.id
	}
	waitState(t, "http://"+gDebug+DebugPath, time.Minute, "3 attached runners owning every shard, seen by the gateway", healthy(ids...))
	before, _ = s.answered()
	s.waitAnswers(t, before, 1)
	close(s.stop)
	<-s.done
	ok, failures := s.answered()
	t.Logf("%d requests answered through the gateway, %d failed", ok, len(failures))
	for i, f := range failures {
		if i == crashRace {
			t.Logf("sent on the connection to %s as it was killed (its answer cannot be known: not counted as lost): %s", r.id, f)
			continue
		}
		t.Errorf("request lost: %s", f)
	}
}

// crashRace returns the index in failures of the one request that may
// fail after a SIGKILL of runner id although none was in flight when it
// died — the first failure from index killed on that names id and says
// "maybe delivered" — or -1. The test holds back its requests while it kills the process, but
// the gateway learns that the connection is dead only when it reads the
// peer's close: a request written on it before then is "maybe delivered"
// (the gateway cannot tell it from one the process ran before it died),
// and at-most-once forbids resending it. One such failure, naming id, is
// the crash's; the gateway then knows, and any other failure is a loss.
func crashRace(failures []string, killed int, id string) int {
	for i := killed; i < len(failures); i++ {
		if strings.Contains(failures[i], "to "+id+":") && strings.Contains(failures[i], "may have been delivered") {
			return i
		}
	}
	return -1
}

// followStop polls a stopping process's readiness until it exits (done):
// the phases of its not-ready answers, and what it answered if it was
// ready again after it was first seen not ready.
func followStop(probe *http.Client, url string, done <-chan struct{}) (notReady []string, readyAgain string) {
	for {
		select {
		case <-done:
			return notReady, readyAgain
		default:
		}
		code, hc := readiness(probe, url)
		switch {
		case code == http.StatusOK && len(notReady) > 0 && readyAgain == "":
			readyAgain = fmt.Sprintf("%s: %s", hc.Phase, hc.Reason)
		case code == http.StatusServiceUnavailable:
			if len(notReady) == 0 || notReady[len(notReady)-1] != hc.Phase {
				notReady = append(notReady, hc.Phase)
			}
		case code == 0 && len(notReady) == 0:
			notReady = append(notReady, "no answer")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runRolesJob runs the script of deploy/kubernetes's etcd-roles Job
// against etcd with ./bin/etcdctl, logged in as root by a client
// certificate (its endpoints and certificate files substituted).
func runRolesJob(t *testing.T, pki *testenv.PKI, etcd *testenv.Etcd) {
	t.Helper()
	var script string
	for _, m := range loadManifests(t) {
		if _, ok := podTemplateOfJob(m); ok {
			script = jobScript(t, m)
		}
	}
	if script == "" {
		t.Fatal("no Job in deploy/kubernetes (the etcd roles)")
	}
	root := pki.MustIssue(t, "etcd-root", testenv.WithCommonName("root"))
	tlsDir := t.TempDir()
	for name, src := range map[string]string{"ca.crt": pki.CAFile(), "tls.crt": root.CertFile, "tls.key": root.KeyFile} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tlsDir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const endpoints = "https://etcd-0.etcd:2379,https://etcd-1.etcd:2379,https://etcd-2.etcd:2379"
	if !strings.Contains(script, endpoints) || !strings.Contains(script, "/etc/etcd/tls/") {
		t.Fatalf("the roles Job's script no longer names %s and /etc/etcd/tls/: update this test", endpoints)
	}
	script = strings.NewReplacer(endpoints, etcd.ClientURL(), "/etc/etcd/tls/", tlsDir+"/").Replace(script)
	binDir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-ec", script)
	cmd.Env = append(os.Environ(), "PATH="+binDir+":"+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the etcd-roles Job's script: %v\n%s", err, out)
	}
}

// jobScript returns the script a Job's container runs with sh -ec.
func jobScript(t *testing.T, m manifest) string {
	t.Helper()
	spec, ok := podTemplateOfJob(m)
	if !ok || len(spec.Containers) != 1 {
		t.Fatalf("%s: not a Job of one container", m.file)
	}
	c := spec.Containers[0]
	if strings.Join(c.Command, " ") != "/bin/sh -ec" || len(c.Args) != 1 {
		t.Fatalf("%s: the Job runs %q %q, want /bin/sh -ec SCRIPT", m.file, c.Command, c.Args)
	}
	return c.Args[0]
}
