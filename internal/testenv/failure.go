package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// ReplayCommand returns the shell command that runs t alone again, from
// the repository root: `go test -count=1 -run '^TestX$/^sub$' ./pkg/`,
// with -race when this test binary has the race detector, and a `cd` into
// a nested module (examples/) when the test is in one.
func ReplayCommand(t testing.TB) string {
	var run []string
	for part := range strings.SplitSeq(t.Name(), "/") {
		run = append(run, "^"+regexp.QuoteMeta(part)+"$")
	}
	race := ""
	if raceEnabled {
		race = "-race "
	}
	cd, pkg := packageDirs()
	return fmt.Sprintf("%sgo test %s-count=1 -run '%s' %s", cd, race, strings.Join(run, "/"), pkg)
}

// packageDirs returns the `cd DIR && ` that enters the test's module from
// the repository root ("" for the root module) and the test's package
// directory relative to that module ("./runner/").
func packageDirs() (cd, pkg string) {
	wd, err := os.Getwd()
	if err != nil {
		return "", "."
	}
	root, err := repoRoot()
	if err != nil {
		return "", "."
	}
	mod := wd
	for mod != root && mod != filepath.Dir(mod) {
		if _, err := os.Stat(filepath.Join(mod, "go.mod")); err == nil {
			break
		}
		mod = filepath.Dir(mod)
	}
	if rel, err := filepath.Rel(root, mod); err == nil && rel != "." {
		cd = "cd " + filepath.ToSlash(rel) + " && "
	}
	rel, err := filepath.Rel(mod, wd)
	if err != nil || rel == "." {
		return cd, "."
	}
	return cd, "./" + filepath.ToSlash(rel) + "/"
}

// OnFailure makes a failed t print what a developer needs to look into it:
// the command that replays it ([ReplayCommand]) and what each report
// returns (the last events of every runner involved, a seed). The helpers
// that start etcd or toxiproxy call it with no report, so every test that
// uses them prints its replay command; tests add their reports. The
// command and the reports are printed once, in the order the reports were
// added, from a t.Cleanup registered by t's first call: registered before
// the runners start, it runs after they have stopped, so a report sees
// everything they recorded.
func OnFailure(t testing.TB, report func() string) {
	t.Helper()
	failures.Lock()
	defer failures.Unlock()
	if failures.m == nil {
		failures.m = map[testing.TB]*[]func() string{}
	}
	reports := failures.m[t]
	if reports == nil {
		reports = new([]func() string)
		failures.m[t] = reports
		t.Cleanup(func() {
			failures.Lock()
			delete(failures.m, t)
			rs := *reports
			failures.Unlock()
			if !t.Failed() {
				return
			}
			msg := "replay: " + ReplayCommand(t)
			for _, r := range rs {
				if s := r(); s != "" {
					msg += "\n" + s
				}
			}
			t.Logf("%s", msg)
		})
	}
	if report != nil {
		*reports = append(*reports, report)
	}
}

var failures struct {
	sync.Mutex
	m map[testing.TB]*[]func() string
}

// SkipIfShort skips t under `go test -short` (the quick loop: no real
// processes, no real-time waits), saying what it needs.
func SkipIfShort(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: skipping a test that %s (make test runs it)", what)
	}
}
