package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"

	"github.com/shardhost/shardhost/storage"
)

// The cold start's progress: while the first runners start, a sample of
// the cluster every -progress, so that a cold start that takes long, or
// never finishes, says how far it got and what it cost.

// ColdSample is the cluster at one instant of the cold start.
type ColdSample struct {
	At float64 `json:"at_s"` // since the first runners started
	// Registered and Locks count the runners/ and shards/ keys in etcd
	// (-1: etcd did not answer within 5 s): runners with a live lease, and
	// shards owned. (Two requests a sample, counted with the cold start's.)
	Registered int `json:"registered"`
	Locks      int `json:"locks"`
	// From the runners' events (no runner is asked, so that a starved
	// runner holding its lock cannot stall the sampling): DetachedNow,
	// the runners detached and not re-attached (in-process runners only;
	// -procs: 0); Detaches and Aborted, the Detached events and aborted
	// handoff phases so far. Stopped: runners whose Run returned (one not
	// ready within its StartTimeout stops).
	DetachedNow int `json:"detached_now"`
	Stopped     int `json:"stopped"`
	Detaches    int `json:"detach_events"`
	Aborted     int `json:"handoffs_aborted"`
	// CPU seconds used since the start by the hosting runners and by etcd;
	// watch events etcd delivered and unary requests it handled meanwhile
	// (-1: its /metrics did not answer within 5 s).
	RunnersCPU  float64 `json:"runners_cpu_s"`
	EtcdCPU     float64 `json:"etcd_cpu_s,omitempty"`
	WatchEvents float64 `json:"etcd_watch_events"`
	Requests    float64 `json:"etcd_requests"`
	// Resources now: the harness process (every in-process runner) and
	// etcd; -procs: the runner processes' resident memory summed.
	RSSMB      float64 `json:"rss_mb"`
	HeapLiveMB float64 `json:"heap_live_mb"` // the harness's heap marked live by the last GC
	Goroutines int     `json:"goroutines"`
	FDs        int     `json:"fds"`
	EtcdRSSMB  float64 `json:"etcd_rss_mb,omitempty"`
	EtcdFDs    int     `json:"etcd_fds,omitempty"`
	// LastPoll: how long the harness's last settle poll took (it asks
	// every runner for its status, which waits for the runner's lock).
	LastPoll float64 `json:"last_settle_poll_ms"`
}

// coldWatch samples the cold start every interval (from start) until stop
// is closed, printing each sample; the samples are returned by wait.
type coldWatch struct {
	h     *harness
	start time.Time
	c0    costMark
	cli   *clientv3.Client // counts the keys (nil: no counts)
	stop  chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	samples []ColdSample
	nodes   []*node // -procs: the runner processes, once started (setNodes)
}

// setNodes gives the sampler the runners started (their processes'
// memory and CPU count with -procs).
func (cw *coldWatch) setNodes(nodes []*node) {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	cw.nodes = nodes
}

// started returns the runners known to the sampler.
func (cw *coldWatch) started() []*node {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return cw.nodes
}

// procs returns the runner processes known to the sampler.
func (cw *coldWatch) procs() []*node {
	var out []*node
	for _, n := range cw.started() {
		if n.proc != nil {
			out = append(out, n)
		}
	}
	return out
}

// watchCold starts sampling the cold start begun at start, whose costs
// count from c0.
func (h *harness) watchCold(start time.Time, c0 costMark) *coldWatch {
	cw := &coldWatch{h: h, start: start, c0: c0, stop: make(chan struct{})}
	if h.p.Progress <= 0 {
		return cw
	}
	cw.cli, _ = newEtcdClient(h.etcd.Endpoint, false) // nil on error: keys are not counted
	cw.wg.Go(func() {
		tick := time.NewTicker(h.p.Progress)
		defer tick.Stop()
		for {
			select {
			case <-cw.stop:
				return
			case <-tick.C:
			}
			s := cw.sample(context.Background())
			cw.mu.Lock()
			cw.samples = append(cw.samples, s)
			cw.mu.Unlock()
			h.say("cold start %s", s)
		}
	})
	return cw
}

// finish stops sampling and returns the samples taken, with a last one
// now if any was taken or the cold start did not finish (done false).
func (cw *coldWatch) finish(done bool) []ColdSample {
	close(cw.stop)
	cw.wg.Wait()
	if cw.h.p.Progress > 0 && (len(cw.samples) > 0 || !done) {
		s := cw.sample(context.Background())
		cw.samples = append(cw.samples, s)
		cw.h.say("cold start %s", s)
	}
	if cw.cli != nil {
		cw.cli.Close()
	}
	return cw.samples
}

func (cw *coldWatch) sample(ctx context.Context) ColdSample {
	h := cw.h
	s := ColdSample{At: time.Since(cw.start).Seconds(), Registered: -1, Locks: -1}
	if cw.cli != nil {
		s.Registered = countKeys(ctx, cw.cli, "/"+h.etcd.Namespace+"/"+string(storage.KeyspaceRunners)+"/")
		s.Locks = countKeys(ctx, cw.cli, "/"+h.etcd.Namespace+"/"+string(storage.KeyspaceShards)+"/")
	}
	s.DetachedNow, s.Detaches, s.Aborted = h.rec.progress()
	for _, n := range cw.started() {
		select {
		case <-n.ran:
			s.Stopped++
		default:
		}
	}
	c := h.costBetween(cw.c0, h.markCostOf(ctx, cw.procs()), 0)
	s.RunnersCPU, s.EtcdCPU, s.WatchEvents, s.Requests = c.RunnersCPU, c.EtcdCPU, c.WatchEvents, c.Requests
	s.Goroutines = runtime.NumGoroutine()
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	if metrics.Read(live); live[0].Value.Kind() == metrics.KindUint64 {
		s.HeapLiveMB = float64(live[0].Value.Uint64()) / (1 << 20)
	}
	s.LastPoll = float64(h.lastPoll.Load()) / 1e6
	self := os.Getpid()
	s.RSSMB, s.FDs = pidRSSMB(self), pidFDs(self)
	for _, n := range cw.procs() {
		s.RSSMB += pidRSSMB(n.proc.p.PID())
	}
	if h.etcd.member != nil {
		s.EtcdRSSMB, s.EtcdFDs = pidRSSMB(h.etcd.member.PID()), pidFDs(h.etcd.member.PID())
	}
	return s
}

// String reads "+5.0s: 183 runners registered (12 detached now, 0
// stopped), 1234 locks held; ...".
func (s ColdSample) String() string {
	return fmt.Sprintf("+%.1fs: %d runners registered (%d detached now, %d stopped), %d locks held; %d detaches, %d handoff phases aborted so far; "+
		"CPU runners %.1f s, etcd %.1f s; etcd delivered %.0f watch events, handled %.0f requests; "+
		"harness %.0f MB (heap live %.0f MB), %d goroutines, %d fds, last settle poll %.1f ms; etcd %.0f MB, %d fds",
		s.At, s.Registered, s.DetachedNow, s.Stopped, s.Locks, s.Detaches, s.Aborted, s.RunnersCPU, s.EtcdCPU, s.WatchEvents, s.Requests,
		s.RSSMB, s.HeapLiveMB, s.Goroutines, s.FDs, s.LastPoll, s.EtcdRSSMB, s.EtcdFDs)
}

// raiseFDLimit raises this process's limit of open files (and its
// children's: etcd, the load child, -procs runners) as far as the system
// allows, up to maxFDs: every in-process runner holds a few sockets, and
// runners that hand shards to each other connect pairwise. It returns the
// limit in force.
func raiseFDLimit() uint64 {
	const maxFDs = 1 << 20
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	if lim.Max < maxFDs {
		want := unix.Rlimit{Cur: maxFDs, Max: maxFDs}
		if unix.Setrlimit(unix.RLIMIT_NOFILE, &want) == nil {
			return maxFDs
		}
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	}
	_ = unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	return lim.Cur
}

// countKeys counts the keys under prefix (-1 when etcd does not answer
// within 5 s: a starved etcd must not stall the sampling for long).
func countKeys(ctx context.Context, cli *clientv3.Client, prefix string) int {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return -1
	}
	return int(resp.Count)
}

// pidRSSMB reads the resident memory of process pid in MB (0: unknown).
func pidRSSMB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// pidFDs counts the open file descriptors of process pid (0: unknown).
func pidFDs(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0
	}
	return len(ents)
}
