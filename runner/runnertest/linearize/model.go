package linearize

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// input and output are an operation as the model sees it.
type input struct {
	kind          Kind
	value, expect int64
}

type output struct {
	known   bool // OK; else pending: any answer goes
	result  int64
	swapped bool
}

// registerModel is the sequential specification: an int64 register that
// starts at 0. A pending write or CAS takes effect where it is placed (a
// pending operation placed last is one that never took effect).
func registerModel() porcupine.Model {
	return porcupine.Model{
		Init: func() any { return int64(0) },
		Step: func(state, in, out any) (bool, any) {
			st, i, o := state.(int64), in.(input), out.(output)
			switch i.kind {
			case Read:
				return !o.known || o.result == st, st
			case Write:
				return true, i.value
			case CAS:
				if st == i.expect {
					return !o.known || (o.swapped && o.result == i.value), i.value
				}
				return !o.known || (!o.swapped && o.result == st), st
			}
			return false, st
		},
		Hash: func(state any) uint64 { return uint64(state.(int64)) },
		DescribeOperation: func(in, out any) string {
			i, o := in.(input), out.(output)
			op := Op{Kind: i.kind, Value: i.value, Expect: i.expect, Outcome: Unknown, Result: o.result, Swapped: o.swapped}
			if o.known {
				op.Outcome = OK
			}
			return op.String()
		},
		DescribeState: func(state any) string { return fmt.Sprint(state.(int64)) },
		DescribeOperationMetadata: func(m any) string {
			s, _ := m.(string)
			return s
		},
	}
}
