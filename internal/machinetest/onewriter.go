package machinetest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// OneWriter fails t unless, among the non-test Go files of dir, the field
// named field (x.field, or any field of it: x.field.y) is assigned,
// incremented or has its address taken in function writer only, and
// exactly once there.
func OneWriter(t testing.TB, dir, field, writer string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
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
				case *ast.UnaryExpr: // &x.field escapes the rule too
					if n.Op == token.AND {
						lhs = []ast.Expr{n.X}
					}
				}
				for _, e := range lhs {
					if !writesField(e, field) {
						continue
					}
					if fn.Name.Name == writer {
						writes++
						continue
					}
					t.Errorf("%s: %s writes %s; only %s may", fset.Position(e.Pos()), fn.Name.Name, field, writer)
				}
				return true
			})
		}
	}
	if writes != 1 {
		t.Errorf("%s writes %s %d times, want 1 (is the check still looking at the right field?)", writer, field, writes)
	}
}

// writesField reports whether e is x.field or a field of it.
func writesField(e ast.Expr, field string) bool {
	for {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		if sel.Sel.Name == field {
			return true
		}
		e = sel.X
	}
}
