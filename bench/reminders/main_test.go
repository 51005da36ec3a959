package main

import (
	"bytes"
	"testing"

	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/bench/internal/scenario"
	"github.com/shardhost/shardhost/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestScenariosMeasureAtTinySizes runs the register, fire and stored
// scenarios at tiny sizes on a real etcd (./bin/etcd): each completes and
// prints its figures, with the properties the benchmark reports: every
// registration done and none failed, every reminder fired at its rate,
// every stored reminder counted and loaded. (steady and moves take a
// minute even tiny: the fault checkers and the runner's tests prove what
// they measure.)
func TestScenariosMeasureAtTinySizes(t *testing.T) {
	testenv.SkipIfShort(t, "runs the benchmark on a real etcd")
	testenv.OnFailure(t, nil) // the replay command
	if _, err := testenv.BinaryPath("etcd"); err != nil {
		t.Fatalf("the benchmark needs ./bin/etcd (make setup): %v", err)
	}
	tiny := []string{"-duration", "1s", "-runners", "2", "-shards", "16"}
	for _, tc := range []struct {
		scenario string
		args     []string
		// each pattern's groups must be numbers > 0 (or the pattern just
		// match, without a group)
		want []string
	}{
		{"register", []string{"-rate", "200"}, []string{
			`(\d+) registrations in .*, 0 failed; Register latency p50 (\d+)\.\d+ ms`,
			`floor: (\d+) raw etcd transactions`,
		}},
		{"fire", []string{"-fire", "300"}, []string{
			`300 reminders due 300/s on one runner: (\d+) fires/s .*fire lag p50 \d+\.\d+ ms`,
		}},
		{"stored", []string{"-stored", "2000"}, []string{
			`2000 reminders written in`, `(2000) keys counted`,
			`every reminder loaded (\d+)(?:\.\d+)?m?s after the start`, // 612ms, or 1.559s on a loaded machine
		}},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			var out bytes.Buffer
			args := append(append([]string{"-scenario", tc.scenario}, tiny...), tc.args...)
			if code := run(args, &out, &out); code != 0 {
				t.Fatalf("run %v: exit %d\n%s", args, code, out.String())
			}
			scenario.Expect(t, out.String(), tc.want)
		})
	}
}

// TestUnknownScenarioIsAUsageError: a scenario name that is not one exits
// 2 and names it, without starting etcd.
func TestUnknownScenarioIsAUsageError(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"-scenario", "nope"}, &out, &out); code != 2 {
		t.Fatalf("exit %d, want 2\n%s", code, out.String())
	}
	if !bytes.Contains(out.Bytes(), []byte(`unknown scenario "nope"`)) {
		t.Errorf("output does not name the scenario: %s", out.String())
	}
}
