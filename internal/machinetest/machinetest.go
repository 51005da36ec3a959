// Package machinetest checks state machines written as STYLE.md asks (one
// switch, its invariants listed, one writer), for their tests: that a
// machine accepts exactly the transitions of its table from every state it
// can reach (Table), and that one function alone assigns its state
// (OneWriter).
package machinetest

import (
	"strings"
	"testing"
)

// Machine is a state machine under test: states S, events 0..Events-1.
type Machine[S comparable, E ~uint8] struct {
	Initial S
	Events  E
	// Next returns the state ev leads to from s, and false (with s) when
	// s refuses ev.
	Next func(s S, ev E) (S, bool)
	// Check returns the first invariant s breaks, or nil.
	Check func(s S) error
	// Name is a state's name in the table; Event an event's.
	Name  func(s S) string
	Event func(ev E) string
}

// Walk calls visit for every state m reaches from its initial state, by
// any events, once each (breadth first).
func (m Machine[S, E]) Walk(visit func(S)) {
	reached := map[S]bool{m.Initial: true}
	queue := []S{m.Initial}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		visit(s)
		for ev := range m.Events {
			if to, ok := m.Next(s, ev); ok && !reached[to] {
				reached[to] = true
				queue = append(queue, to)
			}
		}
	}
}

// Table fails t unless every state m reaches keeps its invariants and
// accepts exactly the transitions table lists, and every state the table
// names is reached. The table lists transitions "from event to", separated
// by semicolons or newlines; within a line, "event to" continues the
// line's first state; a line of one word names a state without
// transitions.
func Table[S comparable, E ~uint8](t testing.TB, m Machine[S, E], table string) {
	t.Helper()
	legal := map[string]string{} // "from event" -> to
	states := map[string]bool{}
	for _, line := range strings.Split(table, "\n") {
		from := ""
		for _, item := range strings.Split(line, ";") {
			f := strings.Fields(item)
			switch {
			case len(f) == 1 && from == "":
				from = f[0]
				states[from] = true
			case len(f) == 3:
				from = f[0]
				states[from] = true
				legal[from+" "+f[1]] = f[2]
			case len(f) == 2 && from != "":
				legal[from+" "+f[0]] = f[1]
			case len(f) != 0:
				t.Fatalf("table item %q: want from event to, or event to after a state", item)
			}
		}
	}
	var reached []S
	m.Walk(func(s S) { reached = append(reached, s) })
	for _, s := range reached {
		name := m.Name(s)
		if err := m.Check(s); err != nil {
			t.Errorf("reachable state %s breaks an invariant: %v", name, err)
		}
		if !states[name] {
			t.Errorf("state %s is reachable but not in the table", name)
		}
		delete(states, name)
		for ev := range m.Events {
			to, ok := m.Next(s, ev)
			want, wantOK := legal[name+" "+m.Event(ev)]
			switch {
			case ok != wantOK:
				t.Errorf("%s on %s: accepted %v, want %v", name, m.Event(ev), ok, wantOK)
			case !ok && to != s:
				t.Errorf("%s on %s: refused but changed the state to %s", name, m.Event(ev), m.Name(to))
			case ok && m.Name(to) != want:
				t.Errorf("%s on %s -> %s, want %s", name, m.Event(ev), m.Name(to), want)
			}
		}
	}
	for s := range states {
		t.Errorf("state %s is in the table but not reachable", s)
	}
}
