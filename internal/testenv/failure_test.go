package testenv

import (
	"strings"
	"testing"
)

func TestReplayCommandRunsThisTestAlone(t *testing.T) {
	t.Run("a sub-test (1)", func(t *testing.T) {
		race := ""
		if raceEnabled {
			race = "-race "
		}
		want := "go test " + race + `-count=1 -run '^TestReplayCommandRunsThisTestAlone$/^a_sub-test_\(1\)$' ./internal/testenv/`
		if got := ReplayCommand(t); got != want {
			t.Errorf("ReplayCommand = %q, want %q", got, want)
		}
	})
}

func TestOnFailurePrintsTheReplayAndEachReportOnce(t *testing.T) {
	f := &failedTB{}
	t.Run("inner", func(t *testing.T) {
		f.TB = t
		OnFailure(f, nil)
		OnFailure(f, func() string { return "first report" })
		OnFailure(f, func() string { return "second report" })
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	got := f.logs.String()
	if strings.Count(got, "replay: go test ") != 1 || !strings.Contains(got, "-run '^TestOnFailurePrintsTheReplayAndEachReportOnce$/^inner$'") {
		t.Errorf("a failed test logged:\n%s\nwant its replay command once", got)
	}
	if i, j := strings.Index(got, "first report"), strings.Index(got, "second report"); i < 0 || j < i || strings.Count(got, "first report") != 1 {
		t.Errorf("a failed test logged:\n%s\nwant each report once, in the order they were added", got)
	}
}
