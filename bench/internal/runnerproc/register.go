package runnerproc

import (
	"context"
	"errors"
	"os"
	"strconv"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
)

// The register: the entity whose histories the fault suite checks for
// linearizability (Register, RegRead, RegWrite, RegCAS). Each instance
// holds an int64 (0 until written) in memory, restores it from its
// checkpoint when it activates, and checkpoints every change (fenced, with
// the Checkpoint it kept from Activate) before it answers: an acknowledged
// change is in the store under its shard's epoch, so it survives crashes
// as well as planned moves, and a former owner can never overwrite it. A
// change whose checkpoint fails is not made in memory either, and the
// call fails with the checkpoint's error. Registers write nothing to the
// history file: the driver's record of every call is their history.

// RegReadReq asks a register for its value.
type RegReadReq struct{}

// RegWriteReq sets a register to Value.
type RegWriteReq struct {
	Value int64 `json:"value"`
}

// RegCASReq sets a register to Value if it holds Expect.
type RegCASReq struct {
	Expect int64 `json:"expect"`
	Value  int64 `json:"value"`
}

// RegResp is a register's answer: its value after the call (for a CAS
// that did not swap, the value it holds) and where the handler ran.
type RegResp struct {
	Value   int64  `json:"value"`
	Swapped bool   `json:"swapped,omitempty"`
	Epoch   int64  `json:"epoch"`
	Runner  string `json:"runner"`
	PID     int    `json:"pid"`
}

type register struct {
	v       int64
	persist func(context.Context, []byte) error
}

// Register is the register kind; every child hosts it and a gateway in
// the parent registers it to route it.
var Register = entity.NewKind("runnerproc-register", func(string) *register { return &register{} })

var (
	// RegRead reads a register (idempotent: sent again after
	// ErrMaybeDelivered).
	RegRead = entity.Method(Register, "read", (*register).Read, entity.Idempotent())
	// RegWrite sets a register (at most once).
	RegWrite = entity.Method(Register, "write", (*register).Write)
	// RegCAS compares and sets a register (at most once).
	RegCAS = entity.Method(Register, "cas", (*register).CAS)
)

var errNoCheckpoint = errors.New("runnerproc: register: the runner has no store to checkpoint in")

func (g *register) Activate(ctx context.Context, info entity.ActivateInfo) error {
	g.persist = info.Checkpoint
	if info.Restore == nil {
		return nil
	}
	data, ok, err := info.Restore(ctx)
	if err != nil || !ok {
		return err
	}
	v, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil {
		return errors.New("runnerproc: register checkpoint is not a number")
	}
	g.v = v
	return nil
}

// set checkpoints v, then holds it.
func (g *register) set(ctx context.Context, v int64) error {
	if g.persist == nil {
		return errNoCheckpoint
	}
	if err := g.persist(ctx, strconv.AppendInt(nil, v, 10)); err != nil {
		return err
	}
	g.v = v
	return nil
}

func (g *register) resp(ctx context.Context) RegResp {
	info, _ := runner.ShardInfoFrom(ctx)
	return RegResp{Value: g.v, Epoch: int64(info.Epoch), Runner: info.Runner, PID: os.Getpid()}
}

func (g *register) Read(ctx context.Context, _ RegReadReq) (RegResp, error) {
	return g.resp(ctx), nil
}

func (g *register) Write(ctx context.Context, req RegWriteReq) (RegResp, error) {
	if err := g.set(ctx, req.Value); err != nil {
		return RegResp{}, err
	}
	return g.resp(ctx), nil
}

func (g *register) CAS(ctx context.Context, req RegCASReq) (RegResp, error) {
	if g.v != req.Expect {
		return g.resp(ctx), nil
	}
	if err := g.set(ctx, req.Value); err != nil {
		return RegResp{}, err
	}
	resp := g.resp(ctx)
	resp.Swapped = true
	return resp, nil
}
