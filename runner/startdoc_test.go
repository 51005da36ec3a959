package runner_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// docComments returns the doc comments of the package's exported
// functions, methods ("Runner.Run") and struct fields ("Config.X").
func docComments(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				key := n.Name.Name
				if n.Recv != nil && len(n.Recv.List) == 1 {
					if star, ok := n.Recv.List[0].Type.(*ast.StarExpr); ok {
						if id, ok := star.X.(*ast.Ident); ok {
							key = id.Name + "." + key
						}
					}
				}
				out[key] = n.Doc.Text()
			case *ast.TypeSpec:
				if st, ok := n.Type.(*ast.StructType); ok {
					for _, fl := range st.Fields.List {
						for _, id := range fl.Names {
							out[n.Name.Name+"."+id.Name] = fl.Doc.Text()
						}
					}
				}
			}
			return true
		})
	}
	return out
}

// TestStartContractHasOneStatement: Run's start-up contract (a store down
// at start delays the start and fails Run after StartTimeout) is stated in
// Runner.Run's doc; Config.StartTimeout and the guide point there instead
// of stating it again, and nothing says that a store down at start does
// not fail Run (TestEtcdDownAtStart shows that it does).
func TestStartContractHasOneStatement(t *testing.T) {
	docs := docComments(t)
	run := docs["Runner.Run"]
	for _, want := range []string{"ErrStartTimeout", "Config.StartTimeout", "WARN", "Status().NotStarted", "storage.ErrPermissionDenied"} {
		if !strings.Contains(run, want) {
			t.Errorf("Runner.Run's doc does not state the start-up contract: no %q in\n%s", want, run)
		}
	}
	guide, err := os.ReadFile("../docs/guide.md")
	if err != nil {
		t.Fatal(err)
	}
	for where, text := range map[string]string{"Runner.Run": run, "Config.StartTimeout": docs["Config.StartTimeout"], "docs/guide.md": string(guide)} {
		if flat := strings.Join(strings.Fields(text), " "); strings.Contains(flat, "does not fail Run") {
			t.Errorf("%s says a store down at start does not fail Run; it does, after StartTimeout", where)
		}
	}
	if st := docs["Config.StartTimeout"]; !strings.Contains(st, "Runner.Run") {
		t.Errorf("Config.StartTimeout's doc does not point at Runner.Run:\n%s", st)
	}
	if !strings.Contains(string(guide), "go doc runner.Runner.Run") {
		t.Error("docs/guide.md does not point at `go doc runner.Runner.Run` for the start-up contract")
	}
}
