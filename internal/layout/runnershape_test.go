package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"slices"
	"strings"
	"testing"
)

// The runner package's central type stays readable: its size is bounded
// here, and each reaction to a shard's change has one home. The bounds
// are where Runner stands, not where it should end (at most 45 fields and
// 130 methods, as in the libraries this one is compared with): lower them
// as parts leave Runner, never raise them.
const (
	maxRunnerFields  = 44
	maxRunnerMethods = 179
)

// parseRunner parses the runner package's non-test files.
func parseRunner(t *testing.T) (*token.FileSet, []*ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, "../../runner", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := pkgs["runner"]
	if p == nil || len(p.Files) < 20 {
		t.Fatalf("parsed %d packages; want the runner package, whole", len(pkgs))
	}
	var files []*ast.File
	for _, f := range p.Files {
		files = append(files, f)
	}
	return fset, files
}

// receiverName returns the type name of a method's receiver ("" for a
// function).
func receiverName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return ""
	}
	t := d.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// TestRunnerStaysWithinItsSize counts, in runner/'s non-test files, the
// fields of the Runner struct (each name once; an embedded type is one)
// and the methods whose receiver is Runner or *Runner, and fails when
// either is over its bound.
func TestRunnerStaysWithinItsSize(t *testing.T) {
	_, files := parseRunner(t)
	fields, methods, exported := -1, 0, 0
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, s := range d.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok || ts.Name.Name != "Runner" {
						continue
					}
					fields = 0
					for _, fl := range ts.Type.(*ast.StructType).Fields.List {
						fields += max(1, len(fl.Names))
					}
				}
			case *ast.FuncDecl:
				if receiverName(d) == "Runner" {
					methods++
					if d.Name.IsExported() {
						exported++
					}
				}
			}
		}
	}
	if fields < 0 {
		t.Fatal("no Runner struct in runner/")
	}
	t.Logf("Runner: %d fields, %d methods (%d exported)", fields, methods, exported)
	if fields > maxRunnerFields {
		t.Errorf("Runner has %d fields (at most %d): give the new state a type of its own", fields, maxRunnerFields)
	}
	if methods > maxRunnerMethods {
		t.Errorf("Runner has %d methods (at most %d): give the new behaviour a type of its own", methods, maxRunnerMethods)
	}
}

// TestAShardChangeReactsInOnePlace checks that the reactions to a change of
// a shard's state are made only by the runner's change hooks
// (shardChangedLocked for one shard, allChangedLocked for all): waking the
// requests parked on it (closing a parkedShard's wake channel), recording
// the owned gauge, telling the router of an epoch, and marking it for the
// control loop's next round. The one exception is the assignment's own
// marking of the shards it moved (markReassignedLocked).
func TestAShardChangeReactsInOnePlace(t *testing.T) {
	fset, files := parseRunner(t)
	homes := map[string][]string{ // reaction -> the functions that may make it
		"wake parked":        {"shardChangedLocked"},
		"shardsOwned.Record": {"recordOwnedLocked"},
		"router.SawEpoch":    {"shardChangedLocked"},
		"work.Add":           {"shardChangedLocked", "markReassignedLocked"},
		"work.AddAll":        {"allChangedLocked"},
		"work.AddMoved":      {"markReassignedLocked"},
	}
	found := map[string]int{}
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				reaction := ""
				switch fun := call.Fun.(type) {
				case *ast.Ident: // close(p.wake)
					if fun.Name == "close" && len(call.Args) == 1 {
						if sel, ok := call.Args[0].(*ast.SelectorExpr); ok && sel.Sel.Name == "wake" {
							reaction = "wake parked"
						}
					}
				case *ast.SelectorExpr:
					if inner, ok := fun.X.(*ast.SelectorExpr); ok {
						if r := inner.Sel.Name + "." + fun.Sel.Name; homes[r] != nil {
							reaction = r
						}
					}
				}
				if reaction == "" {
					return true
				}
				found[reaction]++
				if !slices.Contains(homes[reaction], fn.Name.Name) {
					t.Errorf("%s: %s in %s: a shard's change reacts in the change hooks only (shardChangedLocked, allChangedLocked)",
						fset.Position(call.Pos()), reaction, fn.Name.Name)
				}
				return true
			})
		}
	}
	for r := range homes {
		if found[r] == 0 {
			t.Errorf("no %s found in runner/: the check no longer sees what it guards", r)
		}
	}
}
