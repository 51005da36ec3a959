package machinetest

import (
	"errors"
	"fmt"
	"testing"
)

// counter counts to 2 and back: events up (0) and down (1).
type counter uint8

func counterMachine(next func(counter, uint8) (counter, bool)) Machine[counter, uint8] {
	return Machine[counter, uint8]{
		Events: 2, Next: next,
		Check: func(s counter) error {
			if s > 2 {
				return errors.New("over 2")
			}
			return nil
		},
		Name:  func(s counter) string { return fmt.Sprint("c", int(s)) },
		Event: func(ev uint8) string { return [...]string{"up", "down"}[ev] },
	}
}

func goodNext(s counter, ev uint8) (counter, bool) {
	switch {
	case ev == 0 && s < 2:
		return s + 1, true
	case ev == 1 && s > 0:
		return s - 1, true
	}
	return s, false
}

const counterTable = `
c0 up c1
c1 up c2; down c0
c2 down c1
`

func TestTableAcceptsAMachineThatFollowsIt(t *testing.T) {
	Table(t, counterMachine(goodNext), counterTable)
	Table(t, counterMachine(goodNext), "c0 up c1; c1 up c2; c1 down c0; c2 down c1") // one line, every item whole
}

func TestTableNamesEachDeparture(t *testing.T) {
	for _, tc := range []struct {
		name  string
		next  func(counter, uint8) (counter, bool)
		table string
		want  int
	}{
		{"a transition the table lacks", goodNext, "c0 up c1\nc1 up c2\nc2 down c1", 1},
		{"a transition to another state", goodNext, "c0 up c1\nc1 up c2; down c2\nc2 down c1", 1},
		{"an unreachable state", goodNext, counterTable + "c9\n", 1},
		{"a refusal that changes the state", func(s counter, ev uint8) (counter, bool) {
			if to, ok := goodNext(s, ev); ok || ev == 0 {
				return to, ok
			}
			return 1, false
		}, counterTable, 1},
		{"a broken invariant", func(s counter, ev uint8) (counter, bool) {
			if s == 2 && ev == 0 {
				return 3, true
			}
			return goodNext(s, ev)
		}, counterTable + "c2 up c3\nc3 down c2", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{TB: t}
			Table(r, counterMachine(tc.next), tc.table)
			if len(r.errs) < tc.want {
				t.Errorf("Table found %d problems, want %d", len(r.errs), tc.want)
			}
		})
	}
}
