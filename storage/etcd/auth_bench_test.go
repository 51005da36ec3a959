package etcd_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// etcdCPU returns the CPU time (user + system) of process pid so far.
func etcdCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Skipf("no /proc: %v", err)
	}
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return time.Duration(utime+stime) * 10 * time.Millisecond // clock ticks of 10 ms (USER_HZ 100)
}

// BenchmarkRenewalWithPasswordAuth: what one lease renewal costs etcd when
// the client logs in with a user and password (etcd's default bcrypt cost,
// 10): its CPU time and raft entries (logins) per renewal.
func BenchmarkRenewalWithPasswordAuth(b *testing.B) {
	srv := testenv.StartEtcd(b, testenv.WithTLS(testenv.NewPKI(b, "bench")), testenv.WithAuth(), testenv.WithEtcdArgs("--bcrypt-cost", "10"))
	srv.Cluster().AddPrefixUser(b, "bench", "pw-bench", "/bench/", "readwrite")
	cfg := srv.ClientConfig()
	cfg.Username, cfg.Password = "bench", "pw-bench"
	cfg.DialTimeout = 10 * time.Second
	s, err := etcd.New(testenv.NewEtcdClientWith(b, cfg), "bench", etcd.Config{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	l, err := s.Grant(ctx, 30*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.PutRunner(ctx, l.ID, storage.RunnerRecord{ID: "r1", Address: "127.0.0.1:1", Weight: 1, Incarnation: "i1"}); err != nil {
		b.Fatal(err)
	}
	if _, err := s.KeepAliveOnce(ctx, l.ID); err != nil {
		b.Fatal(err)
	}
	root := srv.Client(b)
	index := func() uint64 {
		st, err := root.Status(ctx, srv.Endpoint())
		if err != nil {
			b.Fatal(err)
		}
		return st.RaftIndex
	}
	cpu0, i0 := etcdCPU(b, srv.PID()), index()
	n, failed := 0, 0
	for b.Loop() {
		if _, err := s.KeepAliveOnce(ctx, l.ID); err != nil {
			failed++ // reported: a renewal that waits for a login may miss its window
		}
		n++
	}
	cpu, entries := etcdCPU(b, srv.PID())-cpu0, index()-i0
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "etcd-cpu-ns/op")
	b.ReportMetric(float64(entries)/float64(n), "raft-entries/op")
	b.ReportMetric(float64(failed)/float64(n), "failed/op")
}
