package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
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
// the command that replays it ([ReplayCommand]), for a test that started
// real processes how long this process went unscheduled while it ran (a
// [StallProbe]: a timing bound missed on a starved machine is told apart
// from one missed on an idle machine), and what each report returns (the
// last events of every runner involved, a seed). The helpers that start
// etcd or toxiproxy call it with no report, so every test that uses them
// prints its replay command; tests add their reports. The command and the
// reports are printed once, in the order the reports were added, from a
// t.Cleanup registered by t's first call: registered before the runners
// start, it runs after they have stopped, so a report sees everything
// they recorded.
func OnFailure(t testing.TB, report func() string) {
	t.Helper()
	onFailure(t, report)
}

// onFailureRealTime is OnFailure(t, nil) for a test that starts real
// processes: its report says how long this process went unscheduled from
// now on. (Not for every test: in a testing/synctest bubble a probe's
// sleeps would step the fake clock every few milliseconds.)
func onFailureRealTime(t testing.TB) {
	f := onFailure(t, nil)
	failures.Lock()
	defer failures.Unlock()
	if f.probe == nil {
		f.probe, f.release = useSharedProbe()
		f.since = time.Now()
	}
}

// failure is what a test's failure report holds.
type failure struct {
	reports []func() string
	probe   *StallProbe // nil unless the test started real processes
	release func()
	since   time.Time
}

func onFailure(t testing.TB, report func() string) *failure {
	failures.Lock()
	defer failures.Unlock()
	if failures.m == nil {
		failures.m = map[testing.TB]*failure{}
	}
	f := failures.m[t]
	if f == nil {
		f = &failure{}
		failures.m[t] = f
		t.Cleanup(func() {
			failures.Lock()
			delete(failures.m, t)
			failures.Unlock()
			if f.release != nil {
				defer f.release()
			}
			if !t.Failed() {
				return
			}
			msg := "replay: " + ReplayCommand(t)
			if f.probe != nil {
				end := time.Now()
				longest, at := f.probe.Longest(f.since, end)
				msg += fmt.Sprintf("\nthis process went unscheduled %v of the %v since the test started its processes (stall probe); the longest stall %v",
					f.probe.Within(f.since, end).Round(time.Millisecond), end.Sub(f.since).Round(time.Millisecond), longest.Round(time.Millisecond))
				if longest > 0 {
					msg += ", ending " + at.Format("15:04:05.000")
				}
			}
			for _, r := range f.reports {
				if s := r(); s != "" {
					msg += "\n" + s
				}
			}
			t.Logf("%s", msg)
		})
	}
	if report != nil {
		f.reports = append(f.reports, report)
	}
	return f
}

var failures struct {
	sync.Mutex
	m map[testing.TB]*failure
}

// SkipIfShort skips t under `go test -short` (the quick loop: no real
// processes, no real-time waits), saying what it needs.
func SkipIfShort(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: skipping a test that %s (make test runs it)", what)
	}
}
