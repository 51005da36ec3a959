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

// TestSetupBuildsEtcdAtTheExamplesVersions: every module that both
// tools/' programs (the etcd server, etcdctl and toxiproxy make setup
// builds) and examples/ (which embeds the etcd server) compile is at the
// same version in both. make setup then compiles those packages — etcd's
// server, and grpc, the etcd client and otel under it — as make test
// needs them, and make test takes them from the build cache instead of
// compiling them a second time. Require examples/' version in
// tools/go.mod (cd tools && go get MODULE@VERSION).
func TestSetupBuildsEtcdAtTheExamplesVersions(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	versions := func(dir string, args ...string) map[string]string {
		m := map[string]string{}
		all := append([]string{"list", "-deps", "-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}"}, args...)
		for _, line := range goList(t, filepath.Join(root, dir), all...) {
			if f := strings.Fields(line); len(f) == 2 {
				m[f[0]] = f[1]
			}
		}
		return m
	}
	tools := versions("tools", "go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/etcdctl/v3", "github.com/Shopify/toxiproxy/v2/cmd/server", "github.com/Shopify/toxiproxy/v2/cmd/cli")
	examples := versions("examples", "-test", "./...")
	shared := 0
	for mod, v := range tools {
		ev, ok := examples[mod]
		if !ok {
			continue
		}
		shared++
		if ev != v {
			t.Errorf("%s: make setup builds %s, examples/ %s: require %s in tools/go.mod", mod, v, ev, ev)
		}
	}
	if _, ok := tools["go.etcd.io/etcd/server/v3"]; !ok || shared < 10 {
		t.Fatalf("tools/ and examples/ share %d modules; want the etcd server's build", shared)
	}
}
