package linearize

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// ErrInvalidOp: an operation of the history cannot be checked (see
// *OpError).
var ErrInvalidOp = errors.New("linearize: invalid operation")

// Kind is what an operation does to its register.
type Kind uint8

// The operations of a register.
const (
	Read  Kind = iota + 1 // returns the value
	Write                 // sets it to Value
	CAS                   // sets it to Value if it holds Expect
)

func (k Kind) String() string {
	switch k {
	case Read:
		return "read"
	case Write:
		return "write"
	case CAS:
		return "cas"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Outcome is what the caller of an operation learnt of it.
type Outcome uint8

// Outcomes.
const (
	// OK: it took effect once, between Call and Return, with the result
	// recorded.
	OK Outcome = iota + 1
	// Failed: it certainly never took effect; left out of the check.
	Failed
	// Unknown: it may have taken effect at any instant after Call, or
	// never.
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Failed:
		return "failed"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Op is one operation of a history, as its caller saw it.
type Op struct {
	Entity  string
	Kind    Kind
	Value   int64 // Write, CAS: the value written
	Expect  int64 // CAS: the value expected
	Outcome Outcome
	// Result, when OK: for a Read, the value read; for a CAS, the value
	// the register holds after it (Value when swapped, the value it held
	// otherwise). Unused for a Write.
	Result  int64
	Swapped bool // a CAS that was OK: whether it swapped
	// Call and Return are the instants the caller invoked the operation
	// and got its answer, in nanoseconds of one clock for the whole
	// history. Return is ignored unless the outcome is OK.
	Call, Return int64
	// Note is shown with the operation in the visualization (where it
	// ran, its error).
	Note string
}

func (op Op) String() string {
	var b strings.Builder
	switch op.Kind {
	case Read:
		b.WriteString("read")
	case Write:
		fmt.Fprintf(&b, "write(%d)", op.Value)
	case CAS:
		fmt.Fprintf(&b, "cas(%d→%d)", op.Expect, op.Value)
	default:
		b.WriteString(op.Kind.String())
	}
	switch {
	case op.Outcome != OK:
		fmt.Fprintf(&b, " %s", op.Outcome)
	case op.Kind == Read:
		fmt.Fprintf(&b, " → %d", op.Result)
	case op.Kind == CAS && op.Swapped:
		b.WriteString(" → swapped")
	case op.Kind == CAS:
		fmt.Fprintf(&b, " → held %d", op.Result)
	}
	return b.String()
}

// OpError reports an operation that cannot be checked; errors.Is(err,
// ErrInvalidOp) holds.
type OpError struct {
	Index  int // in the history given to Check
	Op     Op
	Reason string
}

func (e *OpError) Error() string {
	return fmt.Sprintf("linearize: operation %d (%s of %q): %s", e.Index, e.Op, e.Op.Entity, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidOp) true.
func (e *OpError) Is(target error) bool { return target == ErrInvalidOp }

func validate(i int, op Op) error {
	bad := func(format string, args ...any) error {
		return &OpError{Index: i, Op: op, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case op.Kind < Read || op.Kind > CAS:
		return bad("unknown kind %d", op.Kind)
	case op.Outcome < OK || op.Outcome > Unknown:
		return bad("unknown outcome %d", op.Outcome)
	case op.Outcome == OK && op.Return < op.Call:
		return bad("returned at %d, before its call at %d", op.Return, op.Call)
	}
	return nil
}

// DefaultTimeout bounds the search of one entity when Config.Timeout is 0.
const DefaultTimeout = 10 * time.Second

// Config bounds a check and says where its visualization goes.
type Config struct {
	// Timeout bounds the search of each entity; 0 means DefaultTimeout.
	// An entity not decided in time is Undecided, never a pass.
	Timeout time.Duration
	// HTML is the file the visualization of the first entity found not
	// linearizable is written to; "" writes none.
	HTML string
}

// Report is the outcome of a check.
type Report struct {
	Entities     int      // entities checked
	Ops          int      // operations searched: the OK ones and the pending (unknown) writes and CAS kept
	Pending      int      // of Ops, the unknown ones
	Failed       int      // operations left out because they certainly never took effect
	UnknownReads int      // unknown reads, left out (they constrain nothing)
	Unobserved   int      // unknown writes and CAS left out: their value was never observed
	Illegal      []string // entities whose history is not linearizable
	Undecided    []string // entities whose search ran out of time
	Took         time.Duration
	Slowest      string        // the entity whose search took longest
	SlowestTook  time.Duration // and how long
	HTML         string        // the visualization written ("" if none)
	HTMLErr      error         // why it could not be written
}

// OK reports whether every entity's history was decided linearizable.
func (r *Report) OK() bool { return len(r.Illegal) == 0 && len(r.Undecided) == 0 }

// Add adds o's counts to r (totals over several histories).
func (r *Report) Add(o Report) {
	r.Entities += o.Entities
	r.Ops += o.Ops
	r.Pending += o.Pending
	r.Failed += o.Failed
	r.UnknownReads += o.UnknownReads
	r.Unobserved += o.Unobserved
	r.Illegal = append(r.Illegal, o.Illegal...)
	r.Undecided = append(r.Undecided, o.Undecided...)
	r.Took += o.Took
	if o.SlowestTook > r.SlowestTook {
		r.Slowest, r.SlowestTook = o.Slowest, o.SlowestTook
	}
	if r.HTML == "" {
		r.HTML = o.HTML
	}
	if r.HTMLErr == nil {
		r.HTMLErr = o.HTMLErr
	}
}

func (r Report) String() string {
	verdict := "linearizable"
	switch {
	case len(r.Illegal) > 0:
		verdict = fmt.Sprintf("NOT LINEARIZABLE: %d entities", len(r.Illegal))
	case len(r.Undecided) > 0:
		verdict = fmt.Sprintf("UNDECIDED: %d entities", len(r.Undecided))
	}
	return fmt.Sprintf("%s; %d operations of %d entities checked (%d pending) in %v (slowest %q: %v); left out: %d failed, %d unknown reads, %d unobserved unknown writes/CAS",
		verdict, r.Ops, r.Entities, r.Pending, r.Took.Round(time.Millisecond), r.Slowest, r.SlowestTook.Round(time.Millisecond),
		r.Failed, r.UnknownReads, r.Unobserved)
}

// Check decides, entity by entity, whether history is linearizable. It
// fails only on an operation it cannot check (a *OpError); a history
// that is not linearizable is a Report with Illegal entities.
func Check(history []Op, cfg Config) (Report, error) {
	start := time.Now()
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	var rep Report
	byEntity := map[string][]Op{}
	for i, op := range history {
		if err := validate(i, op); err != nil {
			return Report{}, err
		}
		byEntity[op.Entity] = append(byEntity[op.Entity], op)
	}
	entities := make([]string, 0, len(byEntity))
	for e := range byEntity {
		entities = append(entities, e)
	}
	slices.Sort(entities)
	model := registerModel()
	for _, e := range entities {
		ops := reduce(byEntity[e], &rep)
		rep.Entities++
		rep.Ops += len(ops)
		t0 := time.Now()
		res, info := porcupine.CheckOperationsVerbose(model, operations(ops), cfg.Timeout)
		if took := time.Since(t0); took > rep.SlowestTook {
			rep.Slowest, rep.SlowestTook = e, took
		}
		switch res {
		case porcupine.Illegal:
			rep.Illegal = append(rep.Illegal, e)
			if cfg.HTML != "" && rep.HTML == "" && rep.HTMLErr == nil {
				if err := porcupine.VisualizePath(model, info, cfg.HTML); err != nil {
					rep.HTMLErr = fmt.Errorf("linearize: visualization of %q: %w", e, err)
				} else {
					rep.HTML = cfg.HTML
				}
			}
		case porcupine.Unknown:
			rep.Undecided = append(rep.Undecided, e)
		}
	}
	rep.Took = time.Since(start)
	return rep, nil
}

// reduce leaves out of one entity's operations those that constrain
// nothing: the failed ones, the unknown reads, and (until none is left)
// the unknown writes and CAS whose value no other operation observed (see
// the package doc for why that is sound). It counts them in rep.
func reduce(ops []Op, rep *Report) []Op {
	kept := make([]Op, 0, len(ops))
	for _, op := range ops {
		switch {
		case op.Outcome == Failed:
			rep.Failed++
		case op.Outcome == Unknown && op.Kind == Read:
			rep.UnknownReads++
		default:
			kept = append(kept, op)
		}
	}
	// observed[v]: how many operations observe v (a read or CAS answering
	// it, a CAS expecting it).
	observed := map[int64]int{}
	observe := func(op Op, d int) {
		if op.Outcome == OK && op.Kind != Write {
			observed[op.Result] += d
		}
		if op.Kind == CAS {
			observed[op.Expect] += d
		}
	}
	for _, op := range kept {
		observe(op, 1)
	}
	for changed := true; changed; {
		changed = false
		out := kept[:0]
		for _, op := range kept {
			if op.Outcome == Unknown {
				seen := observed[op.Value]
				if op.Kind == CAS && op.Expect == op.Value {
					seen-- // its own expectation
				}
				if seen <= 0 {
					observe(op, -1)
					rep.Unobserved++
					changed = true
					continue
				}
			}
			out = append(out, op)
		}
		kept = out
	}
	for _, op := range kept {
		if op.Outcome == Unknown {
			rep.Pending++
		}
	}
	return kept
}

// operations converts one entity's operations for porcupine: a pending
// operation returns at +inf; clients are lanes of operations that do not
// overlap, for the visualization only.
func operations(ops []Op) []porcupine.Operation {
	slices.SortStableFunc(ops, func(a, b Op) int { return cmp.Compare(a.Call, b.Call) })
	var laneEnd []int64 // per lane, the return of its last operation
	out := make([]porcupine.Operation, len(ops))
	for i, op := range ops {
		ret := op.Return
		if op.Outcome != OK {
			ret = math.MaxInt64
		}
		lane := slices.IndexFunc(laneEnd, func(end int64) bool { return end < op.Call })
		if lane < 0 {
			lane = len(laneEnd)
			laneEnd = append(laneEnd, 0)
		}
		laneEnd[lane] = ret
		out[i] = porcupine.Operation{
			ClientId: lane,
			Input:    input{kind: op.Kind, value: op.Value, expect: op.Expect},
			Call:     op.Call,
			Output:   output{known: op.Outcome == OK, result: op.Result, swapped: op.Swapped},
			Return:   ret,
			Metadata: op.Note,
		}
	}
	return out
}
