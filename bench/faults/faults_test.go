package main

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
)

// linChecked finds the operations rule 9 checked in a summary.
var linChecked = regexp.MustCompile(`registers \(.*\): linearizable; (\d+) operations of`)

// alwaysChecked finds the runs and lives rule 10 checked in a summary.
var alwaysChecked = regexp.MustCompile(`always-on \(.*\): (\d+) runs and (\d+) lives recorded; two at once: 0;`)

// shortRuns are the runs `make test` does: between them every fault kind.
// One seed whose nine faults are one of each kind (latency, pause, kill,
// reset, scale-up, graceful, leader-pause, a blackhole of the runner the
// scale-up added, leader-kill), so that the suite's fixed cost — a
// 3-member etcd, toxiproxy, four runner processes, two convergences, the
// final reads and the checks — is paid once.
var shortRuns = []struct {
	seed   uint64
	faults int
}{{47685, 9}}

// TestRandomizedFaultsKeepEveryGuarantee runs the fault suite's short
// mode: real runner processes, a 3-member etcd behind toxiproxy, seeded
// fault schedules, and the history checker. Any violation fails the test
// with the run's files kept. It runs in `make test` without the race
// detector (under it, the runner processes are race builds too and the
// 2-core machine is too slow for TTL 5 s to mean anything).
func TestRandomizedFaultsKeepEveryGuarantee(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("the fault suite runs without -race and -short (make test runs it)")
	}
	if _, err := testenv.BinaryPath("etcd"); err != nil {
		t.Fatalf("needs ./bin from make setup: %v", err)
	}
	var out, errOut bytes.Buffer
	sum := 0
	for _, r := range shortRuns {
		seed := r.seed
		out.Reset()
		errOut.Reset()
		start := time.Now()
		code := run([]string{"-runs", "1", "-faults", strconv.Itoa(r.faults), "-seed", strconv.FormatUint(seed, 10)}, &out, &errOut)
		t.Logf("seed %d (%v):\n%s%s", seed, time.Since(start).Round(time.Second), errOut.String(), out.String())
		if code != 0 {
			t.Errorf("seed %d: exit code %d", seed, code)
		}
		if !strings.Contains(out.String(), "violations: 0") {
			t.Errorf("seed %d: the summary does not report 0 violations", seed)
		}
		if m := linChecked.FindStringSubmatch(out.String()); m == nil || m[1] == "0" {
			t.Errorf("seed %d: the summary does not report register operations checked linearizable (rule 9)", seed)
		}
		if m := alwaysChecked.FindStringSubmatch(out.String()); m == nil || m[1] == "0" || m[2] == "0" {
			t.Errorf("seed %d: the summary does not report always-on runs and lives checked, none at once (rule 10)", seed)
		}
		sum++
	}
	if sum != len(shortRuns) {
		t.Fatalf("ran %d of %d seeds", sum, len(shortRuns))
	}
}

func TestScheduleReplaysFromItsSeed(t *testing.T) {
	p := defaultParams()
	for seed := uint64(1); seed < 50; seed++ {
		a, b := scheduleString(schedule(seed, 6, p)), scheduleString(schedule(seed, 6, p))
		if a != b {
			t.Fatalf("schedule(%d) = %q then %q", seed, a, b)
		}
	}
	seen := map[string]bool{}
	for _, r := range shortRuns {
		for _, f := range schedule(r.seed, r.faults, p) {
			seen[f.Kind] = true
		}
	}
	for _, k := range faultKinds {
		if !seen[k] {
			t.Errorf("the short mode's runs %v never inject %s", shortRuns, k)
		}
	}
	for _, f := range schedule(5, 200, p) {
		if f.Kind == faultPause && f.Hold <= p.TTL {
			t.Errorf("%v: a runner pause must outlast the TTL (%v)", f, p.TTL)
		}
		if f.Kind == faultLeaderPause && f.Hold >= p.TTL {
			t.Errorf("%v: a leader pause must stay below the TTL (%v)", f, p.TTL)
		}
	}
}
