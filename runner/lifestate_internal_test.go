package runner

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// name is a state in the notation of lifeTable: the phase's initial (N
// new, C closed, S starting, A attached, D detached, R the stopping
// phase, X stopped), then .d when draining, + in Shutdown's release step.
func (s lifeState) name() string {
	n := string("NCSADRX"[s.phase])
	if s.draining {
		n += ".d"
	}
	if s.stopping {
		n += "+"
	}
	return n
}

// lifeTable is every legal transition from every reachable state: from,
// event, to. Any other event is refused.
const lifeTable = `
N run S;       N close C;     N stop C
C close C;     C stop C
S attach A;    S release S+;  S stop X
S+ release S+; S+ stop X+
A detach D;    A drain A.d;   A release R+;   A stop X
A.d detach D.d; A.d drain A.d; A.d release R.d+; A.d stop X.d
D attach A;    D release D+;  D stop X
D.d attach A.d; D.d release D.d+; D.d stop X.d
D+ release D+; D+ stop X+
D.d+ release D.d+; D.d+ stop X.d+
R+ detach D+;  R+ release R+; R+ stop X+
R.d+ detach D.d+; R.d+ release R.d+; R.d+ stop X.d+
X release X+;  X stop X
X+ release X+; X+ stop X+
X.d release X.d+; X.d stop X.d
X.d+ release X.d+; X.d+ stop X.d+
`

func TestLifecycleAcceptsOnlyItsTransitions(t *testing.T) {
	legal := map[string]string{} // "from event" -> to
	states := map[string]bool{}
	for _, tr := range strings.FieldsFunc(lifeTable, func(r rune) bool { return r == ';' || r == '\n' }) {
		f := strings.Fields(tr)
		if len(f) != 3 {
			continue
		}
		legal[f[0]+" "+f[1]] = f[2]
		states[f[0]] = true
	}
	// Walk every state reachable from a new runner.
	reached := map[lifeState]bool{{}: true}
	queue := []lifeState{{}}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		if err := s.check(); err != nil {
			t.Errorf("reachable state %s breaks an invariant: %v", s.name(), err)
		}
		if !states[s.name()] {
			t.Errorf("state %s is reachable but not in the table", s.name())
		}
		delete(states, s.name())
		for ev := range numPhaseEvents {
			to, ok := s.next(ev)
			want, wantOK := legal[s.name()+" "+ev.String()]
			switch {
			case ok != wantOK:
				t.Errorf("%s on %s: accepted %v, want %v", s.name(), ev, ok, wantOK)
			case !ok && to != s:
				t.Errorf("%s on %s: refused but changed the state to %s", s.name(), ev, to.name())
			case ok && to.name() != want:
				t.Errorf("%s on %s -> %s, want %s", s.name(), ev, to.name(), want)
			}
			if ok && !reached[to] {
				reached[to] = true
				queue = append(queue, to)
			}
		}
	}
	for s := range states {
		t.Errorf("state %s is in the table but not reachable", s)
	}
}

func TestLifecycleCheckNamesEachBrokenInvariant(t *testing.T) {
	for _, s := range []lifeState{
		{phase: phaseNew, stopping: true},
		{phase: phaseClosed, draining: true},
		{phase: phaseStopping},
		{phase: phaseAttached, stopping: true},
		{phase: phaseStarting, draining: true},
	} {
		if s.check() == nil {
			t.Errorf("state %s passes check", s.name())
		}
	}
}

// The lifecycle is assigned in toLocked only, outside the tests: one
// writer for the state machine.
func TestOnlyToLockedWritesTheLifecycle(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	writes := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				var lhs []ast.Expr
				switch n := n.(type) {
				case *ast.AssignStmt:
					lhs = n.Lhs
				case *ast.IncDecStmt:
					lhs = []ast.Expr{n.X}
				case *ast.UnaryExpr: // &r.lifecycle... escapes the rule too
					if n.Op == token.AND {
						lhs = []ast.Expr{n.X}
					}
				}
				for _, e := range lhs {
					if writesLifecycle(e) {
						if fn.Name.Name == "toLocked" {
							writes++
							continue
						}
						t.Errorf("%s: %s writes the lifecycle; only toLocked may", fset.Position(e.Pos()), fn.Name.Name)
					}
				}
				return true
			})
		}
	}
	if writes != 1 {
		t.Errorf("toLocked writes the lifecycle %d times, want 1 (is the check still looking at the right field?)", writes)
	}
}

// writesLifecycle reports whether e is x.lifecycle or a field of it.
func writesLifecycle(e ast.Expr) bool {
	for {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		if sel.Sel.Name == "lifecycle" {
			return true
		}
		e = sel.X
	}
}
