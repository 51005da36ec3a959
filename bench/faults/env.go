package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/storage/etcd"
)

// Bounds of one run's infrastructure.
const (
	startTimeout    = 40 * time.Second // a runner process to register (a restart waits for its old lease: TTL + 2 s)
	stopTimeout     = 40 * time.Second // a graceful stop (the child bounds Shutdown by 30 s)
	namespace       = "faults"
	etcdMembers     = 3
	deleteKeyPrefix = "/" + namespace + "/"
)

// env is one run's cluster: a 3-member etcd from ./bin, a toxiproxy server
// with one proxy per (runner, member) pair, the runner processes, and a
// direct client for the driver and the observers.
type env struct {
	p    params
	dir  string
	etcd *testenv.EtcdCluster
	tox  *testenv.Toxiproxy
	cli  *clientv3.Client // direct to the members (not through toxiproxy)
	obs  *observer
	logf func(format string, args ...any)

	// beforeStop, if set, runs right before a graceful stop of runner.
	beforeStop func(ctx context.Context, runner string)

	mu      sync.Mutex
	runners map[string]*slot
	order   []string
	pids    map[int]*incarnation // every runner process ever started
}

// slot is one runner ID: its proxies and its successive processes.
type slot struct {
	id      string
	proxies []*testenv.Proxy // one per member, in member order
	proc    *runnerproc.Proc // the current process; nil while it is down
}

// incarnation is one runner process and what the schedule did to it.
type incarnation struct {
	id, history string
	proc        *runnerproc.Proc
	started     int64      // Mono before it was launched
	killed      int64      // Mono of its SIGKILL, 0 if none
	termSent    int64      // Mono of its SIGTERM, 0 if none
	exited      int64      // Mono once its exit was seen, 0 if not (yet)
	pauses      [][2]int64 // [SIGSTOP sent, SIGCONT confirmed]
}

func newEnv(ctx context.Context, p params, dir string, logf func(string, ...any)) (_ *env, err error) {
	e := &env{p: p, dir: dir, logf: logf, runners: map[string]*slot{}, pids: map[int]*incarnation{}}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	e.etcd, err = testenv.LaunchEtcdCluster(ctx, etcdMembers, filepath.Join(dir, "etcd"))
	if err != nil {
		return nil, err
	}
	e.tox, err = testenv.LaunchToxiproxy(dir)
	if err != nil {
		return nil, err
	}
	cfg := etcd.ClientConfig(e.etcd.Endpoints())
	cfg.Logger = zap.NewNop()
	e.cli, err = clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	e.obs = startObserver(e.cli, deleteKeyPrefix)
	return e, nil
}

// close stops everything still running; it is safe on a partial env.
func (e *env) close() {
	e.mu.Lock()
	var procs []*runnerproc.Proc
	for _, in := range e.pids {
		procs = append(procs, in.proc)
	}
	e.mu.Unlock()
	for _, p := range procs {
		_ = p.Kill()
	}
	if e.obs != nil {
		e.obs.stop()
	}
	if e.cli != nil {
		_ = e.cli.Close()
	}
	if e.tox != nil {
		_ = e.tox.Close()
	}
	if e.etcd != nil {
		_ = e.etcd.Close()
	}
}

// addRunner creates the proxies of a new runner ID and starts it.
func (e *env) addRunner(ctx context.Context, id string) error {
	s := &slot{id: id}
	for i, m := range e.etcd.Members() {
		px, err := e.tox.NewProxy(fmt.Sprintf("%s-m%d", id, i), m.Endpoint())
		if err != nil {
			return err
		}
		s.proxies = append(s.proxies, px)
	}
	e.mu.Lock()
	e.runners[id] = s
	e.order = append(e.order, id)
	e.mu.Unlock()
	return e.start(ctx, s)
}

// start starts a process for s and waits until it registered.
func (e *env) start(ctx context.Context, s *slot) error {
	eps := make([]string, len(s.proxies))
	for i, px := range s.proxies {
		eps[i] = px.Addr()
	}
	e.mu.Lock()
	n := len(e.pids)
	e.mu.Unlock()
	hist := filepath.Join(e.dir, fmt.Sprintf("history-%s-%d.jsonl", s.id, n))
	spec := runnerproc.Spec{
		Endpoints: eps, Namespace: namespace, History: hist, CheckpointEvery: e.p.CheckpointEvery,
		StatusPoll: 2 * time.Millisecond, Singletons: e.p.Singletons, ShardWorker: true,
		Config: runnerproc.Config{ID: s.id, NumShards: e.p.Shards, LeaseTTL: e.p.TTL},
		// The runners log warnings; SHARDHOST_FAULTS_LOG=info (or debug)
		// when replaying a seed to see why.
		LogLevel: os.Getenv("SHARDHOST_FAULTS_LOG"),
	}
	in := &incarnation{id: s.id, history: hist, started: runnerproc.Mono()}
	sctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	proc, err := runnerproc.Start(sctx, spec)
	if err != nil {
		return &livenessError{fmt.Errorf("runner %s did not register within %v: %w", s.id, startTimeout, err)}
	}
	in.proc = proc
	e.mu.Lock()
	s.proc = proc
	e.pids[proc.PID()] = in
	e.mu.Unlock()
	return nil
}

func (e *env) slot(id string) *slot {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runners[id]
}

func (e *env) incarnationOf(p *runnerproc.Proc) *incarnation {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pids[p.PID()]
}

// live returns the current processes, in start order of their IDs.
func (e *env) live() []*runnerproc.Proc {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*runnerproc.Proc
	for _, id := range e.order {
		if p := e.runners[id].proc; p != nil {
			out = append(out, p)
		}
	}
	return out
}

// apply injects f, waits its hold, heals it and returns the Mono instants
// of injection and heal.
func (e *env) apply(ctx context.Context, f fault) (begin, healed int64, err error) {
	sleep := func(d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s := e.slot(f.Target)
	if onRunner(f.Kind) && (s == nil || s.proc == nil) {
		return 0, 0, fmt.Errorf("%s: runner %q is not running", f.Kind, f.Target)
	}
	if f.Kind == faultGraceful && e.beforeStop != nil {
		e.beforeStop(ctx, f.Target) // before the fault's window opens
	}
	begin = runnerproc.Mono()
	switch f.Kind {
	case faultKill, faultGraceful:
		in := e.incarnationOf(s.proc)
		if f.Kind == faultKill {
			in.killed = runnerproc.Mono()
			err = s.proc.Kill()
		} else {
			in.termSent = runnerproc.Mono()
			sctx, cancel := context.WithTimeout(ctx, stopTimeout)
			err = s.proc.Stop(sctx)
			cancel()
		}
		in.exited = runnerproc.Mono()
		e.mu.Lock()
		s.proc = nil
		e.mu.Unlock()
		if err != nil {
			return begin, 0, fmt.Errorf("%v: %w", f, err)
		}
		if err := sleep(f.Hold); err != nil {
			return begin, 0, err
		}
		healed = runnerproc.Mono()
		return begin, healed, e.start(ctx, s)
	case faultPause:
		in := e.incarnationOf(s.proc)
		stopAt := runnerproc.Mono()
		if err := s.proc.Pause(); err != nil {
			return begin, 0, err
		}
		err1 := sleep(f.Hold)
		err2 := s.proc.Resume()
		healed = runnerproc.Mono()
		e.mu.Lock()
		in.pauses = append(in.pauses, [2]int64{stopAt, healed})
		e.mu.Unlock()
		return begin, healed, errors.Join(err1, err2)
	case faultBlackhole, faultLatency, faultReset:
		for _, px := range s.proxies {
			switch f.Kind {
			case faultBlackhole:
				err = px.SetBlackhole()
			case faultLatency:
				err = px.SetLatency(e.p.TTL + time.Second)
			default:
				err = px.SetResetPeer()
			}
			if err != nil {
				return begin, 0, err
			}
		}
		err1 := sleep(f.Hold)
		var errs []error
		for _, px := range s.proxies {
			errs = append(errs, px.RemoveToxics())
		}
		return begin, runnerproc.Mono(), errors.Join(err1, errors.Join(errs...))
	case faultLeaderKill, faultLeaderPause:
		m, err := e.etcd.LeaderContext(ctx)
		if err != nil {
			return begin, 0, err
		}
		if f.Kind == faultLeaderKill {
			m.Kill()
			if err := sleep(f.Hold); err != nil {
				return begin, 0, err
			}
			healed = runnerproc.Mono()
			return begin, healed, m.RestartContext(ctx)
		}
		m.Pause()
		err1 := sleep(f.Hold)
		m.Resume()
		return begin, runnerproc.Mono(), err1
	case faultScaleUp:
		healed = runnerproc.Mono()
		return begin, healed, e.addRunner(ctx, f.Target)
	}
	return begin, 0, fmt.Errorf("unknown fault %q", f.Kind)
}

// livenessError is a runner process that did not register: a restarted
// runner must register once its predecessor's lease expired, so this is a
// failure of the library, not of the harness.
type livenessError struct{ err error }

func (e *livenessError) Error() string { return e.err.Error() }
func (e *livenessError) Unwrap() error { return e.err }

// stopAll stops every live runner gracefully, concurrently.
func (e *env) stopAll(ctx context.Context) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, p := range e.live() {
		in := e.incarnationOf(p)
		in.termSent = runnerproc.Mono()
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, stopTimeout)
			defer cancel()
			err := p.Stop(sctx)
			in.exited = runnerproc.Mono()
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("stop %s: %w\n%s", p.ID(), err, tailLines(p.Stderr(), 20)))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	e.mu.Lock()
	for _, s := range e.runners {
		s.proc = nil
	}
	e.mu.Unlock()
	return errors.Join(errs...)
}

// incarnations returns every runner process started, by PID.
func (e *env) incarnations() map[int]*incarnation {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[int]*incarnation, len(e.pids))
	for pid, in := range e.pids {
		out[pid] = in
	}
	return out
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// removeDir removes a run's directory, keeping it when asked.
func removeDir(dir string, keep bool) {
	if !keep {
		_ = os.RemoveAll(dir)
	}
}
