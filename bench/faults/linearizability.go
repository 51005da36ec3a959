package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/runner/runnertest/linearize"
)

// The registers: a second load, beside the counters, whose history is
// checked for linearizability (rule 9 in doc.go). Callers read, write and
// compare-and-set Registers registers (runnerproc.Register: every change
// checkpointed, fenced, before it answers) at RegisterRate operations a
// second, open loop; each operation's invocation and return (Mono) and
// outcome (linearize.OutcomeOf) are recorded. Written values are unique in
// the run; a CAS expects the last value the driver saw of its register.

// registers is the driver's record of the register load.
type registers struct {
	next atomic.Int64 // the last value written (values are unique)
	mu   sync.Mutex
	ops  []linearize.Op
	last map[int]int64 // per register, the last value an answer showed
}

func registerID(i int) string { return fmt.Sprintf("g%d", i) }

// callRegister sends one operation of kind to register i and records it.
func (d *driver) callRegister(ctx context.Context, i int, kind linearize.Kind, timeout time.Duration) linearize.Op {
	g := &d.reg
	op := linearize.Op{Entity: registerID(i), Kind: kind}
	if kind != linearize.Read {
		op.Value = g.next.Add(1)
	}
	if kind == linearize.CAS {
		g.mu.Lock()
		op.Expect = g.last[i]
		g.mu.Unlock()
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	var (
		resp runnerproc.RegResp
		err  error
	)
	op.Call = runnerproc.Mono()
	switch kind {
	case linearize.Read:
		resp, err = runnerproc.RegRead.Ask(cctx, d.gw, op.Entity, runnerproc.RegReadReq{})
	case linearize.Write:
		resp, err = runnerproc.RegWrite.Ask(cctx, d.gw, op.Entity, runnerproc.RegWriteReq{Value: op.Value})
	default:
		resp, err = runnerproc.RegCAS.Ask(cctx, d.gw, op.Entity, runnerproc.RegCASReq{Expect: op.Expect, Value: op.Value})
	}
	op.Return = runnerproc.Mono()
	cancel()
	op.Outcome = linearize.OutcomeOf(err)
	if err == nil {
		op.Result, op.Swapped = resp.Value, resp.Swapped
		op.Note = fmt.Sprintf("%s (pid %d) epoch %d", resp.Runner, resp.PID, resp.Epoch)
	} else {
		op.Note = err.Error()
		if len(op.Note) > 300 {
			op.Note = op.Note[:300] + "…"
		}
	}
	g.mu.Lock()
	if err == nil {
		if g.last == nil {
			g.last = map[int]int64{}
		}
		g.last[i] = resp.Value
	}
	g.ops = append(g.ops, op)
	g.mu.Unlock()
	return op
}

// loadRegisters sends RegisterRate operations a second to the registers
// until ctx ends, open loop like load (each on its own goroutine, at most
// MaxInFlight waiting; more are shed): 40 % reads, 30 % writes, 30 % CAS.
func (d *driver) loadRegisters(ctx context.Context, seed uint64) {
	if d.p.Registers <= 0 || d.p.RegisterRate <= 0 {
		return
	}
	rng := rand.New(rand.NewPCG(seed, 2))
	d.openLoop(ctx, d.p.RegisterRate, func() func() {
		i, kind := rng.IntN(d.p.Registers), linearize.Read
		switch n := rng.IntN(10); {
		case n >= 7:
			kind = linearize.CAS
		case n >= 4:
			kind = linearize.Write
		}
		return func() { d.callRegister(context.Background(), i, kind, d.p.AskTimeout) }
	})
}

// readRegisters reads every register once more after the faults (an
// observation of each one's final value), retrying each until it answers
// or ctx ends; it returns the registers that never answered.
func (d *driver) readRegisters(ctx context.Context) []int {
	return untilAnswered(ctx, d.p.Registers, func(i int) bool {
		return d.callRegister(ctx, i, linearize.Read, d.p.AskTimeout).Outcome == linearize.OK
	})
}

func (d *driver) registerOps() []linearize.Op {
	d.reg.mu.Lock()
	defer d.reg.mu.Unlock()
	return append([]linearize.Op(nil), d.reg.ops...)
}

// linTimeout bounds the search of one register's history.
const linTimeout = 30 * time.Second

// Files of the rule in a run's directory.
const (
	registersFile = "registers.jsonl"      // the register history (linearize.WriteHistory)
	linHTMLFile   = "linearizability.html" // the first failing register's visualization
)

// checkLinearizable is rule 9: every register's history is linearizable.
// The history is written to the run's directory (kept with its files when
// the run fails, or with -keep; -check-registers checks it again), and so
// is the visualization of the first register that is not linearizable.
func checkLinearizable(ops []linearize.Op, dir string) (linearize.Report, []string) {
	var vs []string
	if err := writeRegisters(filepath.Join(dir, registersFile), ops); err != nil {
		vs = append(vs, fmt.Sprintf("linearizability: keep the history: %v", err))
	}
	rep, err := linearize.Check(ops, linearize.Config{Timeout: linTimeout, HTML: filepath.Join(dir, linHTMLFile)})
	if err != nil {
		return rep, append(vs, fmt.Sprintf("linearizability: the history cannot be checked: %v", err))
	}
	if n := len(rep.Illegal); n > 0 {
		where := fmt.Sprintf("visualization of %s in %s", rep.Illegal[0], rep.HTML)
		if rep.HTMLErr != nil {
			where = rep.HTMLErr.Error()
		}
		vs = append(vs, fmt.Sprintf("not linearizable: %d registers (e.g. %s; %s)", n, rep.Illegal[0], where))
	}
	if n := len(rep.Undecided); n > 0 {
		vs = append(vs, fmt.Sprintf("linearizability undecided within %v for %d registers (e.g. %s): not a pass", linTimeout, n, rep.Undecided[0]))
	}
	return rep, vs
}

func writeRegisters(path string, ops []linearize.Op) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := linearize.WriteHistory(f, ops); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// checkRegistersFile checks a register history a run kept (-check-registers)
// and writes the visualization of the first failing register beside it.
func checkRegistersFile(path string, stdout io.Writer) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	ops, err := linearize.ReadHistory(f)
	f.Close()
	if err != nil {
		return err
	}
	html := strings.TrimSuffix(path, filepath.Ext(path)) + ".html"
	rep, err := linearize.Check(ops, linearize.Config{Timeout: linTimeout, HTML: html})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %s\n", path, rep)
	if len(rep.Illegal) > 0 {
		fmt.Fprintf(stdout, "not linearizable: %s; visualization of %s: %s %v\n", strings.Join(rep.Illegal, ", "), rep.Illegal[0], rep.HTML, rep.HTMLErr)
	}
	if !rep.OK() {
		return errors.New("not linearizable or undecided")
	}
	return nil
}
