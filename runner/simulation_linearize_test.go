package runner_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/runner/runnertest/linearize"
)

// The simulation's registers: a load beside the counters whose history is
// checked for linearizability after each run (outside the synctest bubble,
// in real time, so that the checker's time bound means something). A
// register checkpoints every change (fenced, with the Checkpoint it kept
// from Activate) before it answers and restores on activation; now and
// then a CAS is stubborn: it ignores its context while it works, then
// checkpoints without one — the read-modify-write a zombie owner attempts
// after its shard moved, which fencing must refuse.

// simRegisters is how many registers the simulation's callers address.
const simRegisters = 4

type simRegister struct {
	v       int64
	persist func(context.Context, []byte) error
	w       *simWorld // every handler run is an execution of the world (single-writer check)
}

type simRegReq struct {
	Expect, Value int64
	Sleep         time.Duration
	Stubborn      bool
}

type simRegResp struct {
	Value   int64
	Swapped bool
	Runner  string
	Epoch   int64
}

func (g *simRegister) Activate(ctx context.Context, info entity.ActivateInfo) error {
	g.persist = info.Checkpoint
	data, ok, err := info.Restore(ctx)
	if err != nil || !ok {
		return err
	}
	_, err = fmt.Sscan(string(data), &g.v)
	return err
}

func (g *simRegister) resp(ctx context.Context) simRegResp {
	info, _ := runner.ShardInfoFrom(ctx)
	return simRegResp{Value: g.v, Runner: info.Runner, Epoch: int64(info.Epoch)}
}

func simWork(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// exec records a handler run in the world until the returned func.
func (g *simRegister) exec(ctx context.Context, stubborn bool) func() {
	info, _ := runner.ShardInfoFrom(ctx)
	id := g.w.begin(info, stubborn)
	return func() { g.w.end(id) }
}

func (g *simRegister) Read(ctx context.Context, r simRegReq) (simRegResp, error) {
	defer g.exec(ctx, false)()
	if err := simWork(ctx, r.Sleep); err != nil {
		return simRegResp{}, err
	}
	return g.resp(ctx), nil
}

func (g *simRegister) Write(ctx context.Context, r simRegReq) (simRegResp, error) {
	defer g.exec(ctx, false)()
	if err := simWork(ctx, r.Sleep); err != nil {
		return simRegResp{}, err
	}
	if err := g.persist(ctx, []byte(fmt.Sprint(r.Value))); err != nil {
		return simRegResp{}, err
	}
	g.v = r.Value
	return g.resp(ctx), nil
}

func (g *simRegister) CAS(ctx context.Context, r simRegReq) (simRegResp, error) {
	defer g.exec(ctx, r.Stubborn)()
	pctx := ctx
	if r.Stubborn {
		time.Sleep(r.Sleep)
		pctx = context.Background()
	} else if err := simWork(ctx, r.Sleep); err != nil {
		return simRegResp{}, err
	}
	if g.v != r.Expect {
		return g.resp(ctx), nil
	}
	if err := g.persist(pctx, []byte(fmt.Sprint(r.Value))); err != nil {
		return simRegResp{}, err
	}
	g.v = r.Value
	resp := g.resp(ctx)
	resp.Swapped = true
	return resp, nil
}

// simLin is one run's register kind, callers and history.
type simLin struct {
	kind              *entity.Kind[simRegister]
	read, write, cas  *entity.MethodRef[simRegister, simRegReq, simRegResp]
	stop              chan struct{}
	wg                sync.WaitGroup
	mu                sync.Mutex
	ops               []linearize.Op
	next              int64            // the last value written (values are unique)
	last              map[string]int64 // per register, the last value an answer showed
	stubborn, swapped int
}

func newSimLin(w *simWorld) *simLin {
	l := &simLin{stop: make(chan struct{}), last: map[string]int64{}}
	l.kind = entity.NewKind("register", func(string) *simRegister { return &simRegister{w: w} })
	l.read = entity.Method(l.kind, "read", (*simRegister).Read, entity.Idempotent())
	l.write = entity.Method(l.kind, "write", (*simRegister).Write)
	l.cas = entity.Method(l.kind, "cas", (*simRegister).CAS)
	return l
}

// drive starts two callers of the registers through gw, one operation at
// a time each: 40 % reads, 30 % writes, 30 % CAS expecting the last value
// seen (1 in 25 stubborn, working 1-6 s).
func (l *simLin) drive(seed uint64, gw *runner.Runner) {
	for caller := range 2 {
		rng := rand.New(rand.NewPCG(seed, uint64(caller)+200))
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				case <-time.After(time.Duration(5+rng.IntN(40)) * time.Millisecond):
				}
				id := fmt.Sprintf("g%d", rng.IntN(simRegisters))
				req := simRegReq{Sleep: time.Duration(rng.IntN(30)) * time.Millisecond}
				kind := linearize.Read
				switch n := rng.IntN(10); {
				case n >= 7:
					kind = linearize.CAS
					if rng.IntN(25) == 0 {
						req.Sleep, req.Stubborn = time.Duration(1+rng.IntN(6))*time.Second, true
					}
				case n >= 4:
					kind = linearize.Write
				}
				l.call(gw, id, kind, req)
			}
		})
	}
}

func (l *simLin) call(gw *runner.Runner, id string, kind linearize.Kind, req simRegReq) {
	l.mu.Lock()
	if kind != linearize.Read {
		l.next++
		req.Value = l.next
	}
	req.Expect = l.last[id]
	if req.Stubborn {
		l.stubborn++
	}
	l.mu.Unlock()
	op := linearize.Op{Entity: id, Kind: kind, Value: req.Value, Call: int64(time.Since(simStart))}
	if kind == linearize.CAS {
		op.Expect = req.Expect
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	var (
		resp simRegResp
		err  error
	)
	switch kind {
	case linearize.Read:
		resp, err = l.read.Ask(ctx, gw, id, req)
	case linearize.Write:
		resp, err = l.write.Ask(ctx, gw, id, req)
	default:
		resp, err = l.cas.Ask(ctx, gw, id, req)
	}
	cancel()
	op.Return = int64(time.Since(simStart))
	op.Outcome = linearize.OutcomeOf(err)
	if err == nil {
		op.Result, op.Swapped = resp.Value, resp.Swapped
		op.Note = fmt.Sprintf("%s epoch %d", resp.Runner, resp.Epoch)
	} else {
		op.Note = err.Error()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		l.last[id] = resp.Value
		if resp.Swapped {
			l.swapped++
		}
	}
	l.ops = append(l.ops, op)
}

// halt stops the callers and waits for their last operations.
func (l *simLin) halt() {
	close(l.stop)
	l.wg.Wait()
}

func (l *simLin) history() []linearize.Op {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]linearize.Op(nil), l.ops...)
}

// checkSimLinearizable checks one seed's register histories; a history
// that is not linearizable (or undecided) fails t, with the visualization
// of the first register that is not written to the temp directory.
func checkSimLinearizable(t *testing.T, seed uint64, ops []linearize.Op) linearize.Report {
	t.Helper()
	html := filepath.Join(os.TempDir(), fmt.Sprintf("shardhost-simulation-%d-linearizability.html", seed))
	rep, err := linearize.Check(ops, linearize.Config{HTML: html})
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	if !rep.OK() {
		where := rep.HTML
		if rep.HTMLErr != nil {
			where = rep.HTMLErr.Error()
		}
		t.Errorf("seed %d (replay: %s): register histories %s (not linearizable: %v, undecided: %v); visualization: %s",
			seed, simReplay(seed), rep, rep.Illegal, rep.Undecided, where)
	}
	return rep
}

// TestLinearizabilityCheckRejectsAStoreWithoutFencing proves the check can
// fail: with the in-memory store's fencing disabled, a stubborn CAS of a
// former owner lands after the new owner's acknowledged writes, and a
// later owner restores it — a history no single copy of the register can
// produce. The seeds are scanned until one shows it.
func TestLinearizabilityCheckRejectsAStoreWithoutFencing(t *testing.T) {
	t.Parallel()
	const maxSeeds = 300
	for seed := uint64(1); seed <= maxSeeds; seed++ {
		var st simStats
		synctest.Test(t, func(t *testing.T) { st = simulate(t, seed, simOptions{unfenced: true}) })
		html := filepath.Join(t.TempDir(), "linearizability.html")
		rep, err := linearize.Check(st.linOps, linearize.Config{HTML: html})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Illegal) == 0 {
			continue
		}
		if rep.HTML != html || rep.HTMLErr != nil {
			t.Fatalf("seed %d: %v, but no visualization (%q, %v)", seed, rep, rep.HTML, rep.HTMLErr)
		}
		if fi, err := os.Stat(html); err != nil || fi.Size() == 0 {
			t.Fatalf("seed %d: the visualization %s: %v", seed, html, err)
		}
		t.Logf("seed %d: %v (registers %v); the simulation's other checks found %d violations", seed, rep, rep.Illegal, st.violations)
		return
	}
	t.Fatalf("no seed of 1..%d gave a history the checker rejects, with fencing disabled", maxSeeds)
}
