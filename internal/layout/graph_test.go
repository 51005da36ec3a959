package layout

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/shardhost/shardhost/"

// layers orders the module's packages: a package may import packages of
// its own layer or below, never above (the first matching prefix decides;
// rules for the library's parts come before the broader ones).
var layers = []struct {
	prefix string
	layer  int
}{
	{"sharding", 0},
	{"detachment", 0},
	{"storage/etcd", 2},
	{"storage/memory", 2},
	{"storage/storagetest", 2},
	{"storage", 1},
	{"entity", 1},
	{"lease", 2},
	{"transport", 2},
	{"runner/internal/", 3},
	{"runner/runnertest/", 5}, // test helpers over a runner's recorded events
	{"runner", 4},
	{"internal/", 0}, // test helpers that import nothing of the module (testenv starts processes)
	{"cmd/", 5},
	{"bench/internal/", 5},
	{"bench", 6},
}

func layerOf(t *testing.T, pkg string) int {
	for _, l := range layers {
		if pkg == l.prefix || strings.HasPrefix(pkg, strings.TrimSuffix(l.prefix, "/")+"/") {
			return l.layer
		}
	}
	t.Fatalf("package %s is in no layer: add it to layers (and to README's Layout table)", pkg)
	return 0
}

// TestImportsPointDownTheLayers lists every package of the module with
// its non-test imports (go list) and checks them against layers, plus
// the rules Go does not enforce: the library imports no test helper
// (internal/, runner/runnertest/) and no harness (bench/), a helper under
// internal/ imports nothing of the module but internal/, and only bench/
// imports bench/.
func TestImportsPointDownTheLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		pkg := strings.TrimPrefix(f[0], module)
		pkgs++
		from := layerOf(t, pkg)
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			imp = strings.TrimPrefix(imp, module)
			to := layerOf(t, imp)
			switch {
			case to > from:
				t.Errorf("%s (layer %d) imports %s (layer %d): an upward import", pkg, from, imp, to)
			case !isTestCode(pkg) && isTestCode(imp):
				t.Errorf("%s, a library package, imports the test helper or harness %s", pkg, imp)
			case strings.HasPrefix(pkg, "internal/") && !strings.HasPrefix(imp, "internal/"):
				t.Errorf("%s imports %s: a test helper under internal/ imports nothing of the module but internal/", pkg, imp)
			case strings.HasPrefix(imp, "bench/") && !strings.HasPrefix(pkg, "bench/"):
				t.Errorf("%s imports %s: only bench/ may", pkg, imp)
			}
		}
	}
	if pkgs < 20 {
		t.Fatalf("go list named %d packages; want the whole module", pkgs)
	}
}

// isTestCode reports whether pkg is a test helper or a harness: code the
// library never imports. cmd/ is neither: a program, imported by nothing.
func isTestCode(pkg string) bool {
	for _, p := range []string{"internal/", "runner/runnertest/", "bench/"} {
		if strings.HasPrefix(pkg, p) {
			return true
		}
	}
	return false
}
