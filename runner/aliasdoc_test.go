package runner_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestAliasesOfInternalTypesListTheirFields: go doc shows an alias without
// the fields of the type it names, so every alias in package runner of a
// struct type from an internal package (DebugConfig, DebugState,
// NotOwnerError, ...) names each exported field of that struct in its own
// comment, and `go doc runner.X` tells a user what X holds.
func TestAliasesOfInternalTypesListTheirFields(t *testing.T) {
	const module = "github.com/shardhost/shardhost/"
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	structs := map[string]map[string]*ast.StructType{} // package dir -> type name -> struct
	structOf := func(dir, name string) *ast.StructType {
		if structs[dir] == nil {
			structs[dir] = map[string]*ast.StructType{}
			srcs, _ := filepath.Glob(filepath.Join(dir, "*.go"))
			for _, src := range srcs {
				if strings.HasSuffix(src, "_test.go") {
					continue
				}
				f, err := parser.ParseFile(fset, src, nil, 0)
				if err != nil {
					t.Fatal(err)
				}
				ast.Inspect(f, func(n ast.Node) bool {
					if ts, ok := n.(*ast.TypeSpec); ok {
						if st, ok := ts.Type.(*ast.StructType); ok {
							structs[dir][ts.Name.Name] = st
						}
					}
					return true
				})
			}
		}
		return structs[dir][name]
	}
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		imports := map[string]string{} // local name -> import path
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			local := filepath.Base(path)
			if imp.Name != nil {
				local = imp.Name.Name
			}
			imports[local] = path
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				if !ts.Assign.IsValid() || !ts.Name.IsExported() {
					continue
				}
				target := ts.Type
				if ix, ok := target.(*ast.IndexExpr); ok {
					target = ix.X
				}
				sel, ok := target.(*ast.SelectorExpr)
				if !ok {
					continue
				}
				pkg, _ := sel.X.(*ast.Ident)
				path := imports[pkg.Name]
				if !strings.HasPrefix(path, module+"runner/internal/") {
					continue
				}
				st := structOf(filepath.Join("..", strings.TrimPrefix(path, module)), sel.Sel.Name)
				if st == nil {
					continue // not a struct
				}
				doc := ts.Doc.Text()
				if doc == "" && len(gd.Specs) == 1 {
					doc = gd.Doc.Text()
				}
				checked++
				for _, field := range st.Fields.List {
					for _, id := range field.Names {
						if id.IsExported() && !regexp.MustCompile(`\b`+id.Name+`\b`).MatchString(doc) {
							t.Errorf("%s: the comment of alias %s (= %s.%s) does not name its field %s: go doc would not show it",
								fset.Position(ts.Pos()), ts.Name.Name, pkg.Name, sel.Sel.Name, id.Name)
						}
					}
				}
			}
		}
	}
	if checked < 10 {
		t.Errorf("checked %d aliases of internal struct types, want at least the 10 debug page types", checked)
	}
}
