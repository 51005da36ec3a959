//go:build linux

package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/internal/testenv"
)

// TestSecureDemoScript runs `make demo-cluster-secure` itself (run.sh with
// SECURE=1, on free ports, 64 shards) until its gateway sees the three
// runners own every shard, and checks the least privilege it sets up:
//   - the transport has a CA of its own: a certificate of that CA named
//     after etcd's runner user is refused by etcd (the same certificate
//     from etcd's CA logs in as that user without a password: with one CA
//     for both, any transport certificate could be an etcd user);
//   - the gateway's user reads runners/ and the cluster record, and not
//     the entities' state (checkpoints/, reminders/, remembered/), as
//     SECURITY.md prescribes.
func TestSecureDemoScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the whole secure demo")
	}
	for _, tool := range []string{"openssl", "setsid", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("run.sh with SECURE=1 needs %s: %v", tool, err)
		}
	}
	etcdBin, err := testenv.BinaryPath("etcd")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// run.sh checks its ports free, then builds its programs (minutes on a
	// loaded machine), then binds them: in between, a test process beside
	// it may take one of them (a runner then fails with "address already
	// in use"). Built here first, its builds come from the build cache, and
	// the ports are chosen only now: seconds between the check and the
	// binds instead of minutes.
	for _, b := range []struct{ dir, pkg string }{{"..", "./cluster"}, {"../..", "./cmd/shardhostctl"}} {
		build := exec.Command("go", "build", "-o", filepath.Join(dir, "prebuilt", filepath.Base(b.pkg)), b.pkg)
		build.Dir = b.dir
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	base := testenv.FreePortRange(t, 9) // etcd 2, debug pages 4, transports 3 (run.sh's layout)
	demo := filepath.Join(dir, "demo")
	logf, err := os.Create(filepath.Join(dir, "run.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("bash", "run.sh")
	cmd.Env = append(os.Environ(), "SECURE=1", "DEMO_DIR="+demo, "SHARDHOST_BIN="+filepath.Dir(etcdBin),
		"ETCD_PORT="+strconv.Itoa(base), "DEBUG_PORT="+strconv.Itoa(base+2), "TRANSPORT_PORT="+strconv.Itoa(base+5),
		"SHARDS=64", "RATE=20")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM} // its trap stops the demo
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("run.sh:\n%s", tail(string(b), 40))
			for _, name := range []string{"runner-1", "runner-2", "runner-3", "gateway"} {
				b, _ := os.ReadFile(filepath.Join(demo, name+".log"))
				t.Logf("%s.log:\n%s", name, tail(string(b), 15))
			}
		}
	})
	// run.sh builds the programs first (minutes on a loaded machine, the
	// link of examples/cluster included): the cluster's 3 minutes start
	// once the last program is built.
	built := filepath.Join(demo, "bin", "shardhostctl")
	for deadline := time.Now().Add(10 * time.Minute); ; {
		if _, err := os.Stat(built); err == nil {
			break
		}
		select {
		case <-done:
			t.Fatal("run.sh exited before it built the demo's programs")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("run.sh did not build the demo's programs in 10 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	gateway := fmt.Sprintf("http://127.0.0.1:%d%s", base+2, DebugPath)
	waitState(t, gateway, 3*time.Minute, "the demo's 3 runners owning every shard, seen by the gateway", healthy("runner-1", "runner-2", "runner-3"))

	pki := filepath.Join(demo, "pki")
	etcdCA := readFile(t, filepath.Join(pki, "etcd", "ca.pem"))
	endpoint := fmt.Sprintf("https://127.0.0.1:%d", base)
	// get reads key (a prefix when it ends with "/") as the holder of cert,
	// logged in as user when given. Its bound is no measure of anything: a
	// login costs etcd a bcrypt comparison, seconds on a starved machine,
	// and the test checks what is allowed, not how fast. A read that must
	// fail (a refused certificate) fails by this bound, so it stays short.
	var getWithin func(bound time.Duration, cert tls.Certificate, user, password, key string) error
	get := func(cert tls.Certificate, user, password, key string) error {
		return getWithin(30*time.Second, cert, user, password, key)
	}
	getWithin = func(bound time.Duration, cert tls.Certificate, user, password, key string) error {
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(etcdCA)
		cfg := clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: bound, Logger: zap.NewNop(),
			TLS: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, Username: user, Password: password}
		cli, err := clientv3.New(cfg)
		if err != nil {
			return err
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		opts := []clientv3.OpOption{clientv3.WithCountOnly()}
		if strings.HasSuffix(key, "/") {
			opts = append(opts, clientv3.WithPrefix())
		}
		_, err = cli.Get(ctx, key, opts...)
		return err
	}

	// A certificate named after the runners' etcd user, no password.
	forged := issueFrom(t, filepath.Join(pki, "transport"), "shardhost-demo")
	if err := getWithin(3*time.Second, forged, "", "", "/demo/runners/"); err == nil {
		t.Error("a certificate of the transport CA named shardhost-demo read /demo/ from etcd: the transport CA is etcd's")
	} else {
		t.Logf("etcd refuses a transport certificate named after its user: %v", err)
	}
	if err := get(issueFrom(t, filepath.Join(pki, "etcd"), "shardhost-demo"), "", "", "/demo/runners/"); err != nil {
		t.Errorf("the same certificate from etcd's CA: %v; want it logged in as shardhost-demo (what a shared CA would give away)", err)
	}

	// The gateway's user: what a gateway reads, not the entities' state.
	gw, err := tls.LoadX509KeyPair(filepath.Join(pki, "etcd", "gateway.pem"), filepath.Join(pki, "etcd", "gateway-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pw := strings.TrimSpace(string(readFile(t, filepath.Join(pki, "shardhost-demo-gateway.password"))))
	for _, key := range []string{"/demo/runners/", "/demo/shards/", "/demo/handoffs/", "/demo/drains/", "/demo/cluster"} {
		if err := get(gw, "shardhost-demo-gateway", pw, key); err != nil {
			t.Errorf("the gateway's user reading %s: %v", key, err)
		}
	}
	for _, key := range []string{"/demo/checkpoints/", "/demo/reminders/", "/demo/remembered/"} {
		if err := get(gw, "shardhost-demo-gateway", pw, key); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("the gateway's user reading %s: %v, want permission denied", key, err)
		}
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// issueFrom returns a client certificate named cn, issued by the CA whose
// ca.pem and ca-key.pem run.sh wrote in dir.
func issueFrom(t *testing.T, dir, cn string) tls.Certificate {
	t.Helper()
	caBlock, _ := pem.Decode(readFile(t, filepath.Join(dir, "ca.pem")))
	keyBlock, _ := pem.Decode(readFile(t, filepath.Join(dir, "ca-key.pem")))
	if caBlock == nil || keyBlock == nil {
		t.Fatalf("%s: no PEM CA or key", dir)
	}
	ca, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := x509.ParsePKCS8PrivateKey(keyBlock.Bytes)
	if err != nil {
		if caKey, err = x509.ParseECPrivateKey(keyBlock.Bytes); err != nil {
			t.Fatal(err)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
