package layout

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestExamplesBuildTheLibraryAtItsVersions: every module a package of the
// library's build depends on is at the same version in examples/' build
// list. Otherwise everything above it (grpc, the etcd client, the whole
// library) is compiled twice in make test, once per module, with and
// without -race (a genproto newer in examples/ did that). Require
// examples/' version in the root go.mod (go get MODULE@VERSION).
func TestExamplesBuildTheLibraryAtItsVersions(t *testing.T) {
	used := goList(t, ".", "list", "-deps", "-test", "-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}", module+"...")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	examples := map[string]string{}
	for _, line := range goList(t, filepath.Join(root, "examples"), "list", "-m", "all") {
		if f := strings.Fields(line); len(f) >= 2 {
			examples[f[0]] = f[1]
		}
	}
	checked := map[string]bool{}
	for _, line := range used {
		f := strings.Fields(line)
		if len(f) != 2 || checked[f[0]] {
			continue
		}
		checked[f[0]] = true
		if v, ok := examples[f[0]]; ok && v != f[1] {
			t.Errorf("%s: the library builds %s, examples/ %s: require %s in the root go.mod", f[0], f[1], v, v)
		}
	}
	if len(checked) == 0 {
		t.Fatal("go list found no module the library depends on")
	}
}

// goList runs the go command in dir and returns its output's lines.
func goList(t *testing.T, dir string, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s in %s: %v", strings.Join(args, " "), dir, err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}
