package main

import (
	"bytes"
	"testing"

	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/bench/internal/scenario"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
)

func TestMain(m *testing.M) {
	childMain() // the crash scenario's runner processes
	goleak.VerifyTestMain(m)
}

// TestEveryScenarioMeasuresAtTinySizes runs each scenario at tiny sizes on
// a real etcd (./bin/etcd): it completes (a scenario fails on two
// instances of a singleton at once, or a remembered entity not running
// again after a crash) and prints its figures, with the properties the
// benchmark reports: no overlap, singletons and remembered entities moved
// and recovered, no write per message nor marker write on a move.
func TestEveryScenarioMeasuresAtTinySizes(t *testing.T) {
	testenv.SkipIfShort(t, "runs the benchmark on a real etcd")
	testenv.OnFailure(t, nil) // the replay command
	if _, err := testenv.BinaryPath("etcd"); err != nil {
		t.Fatalf("the benchmark needs ./bin/etcd (make setup): %v", err)
	}
	// A 1 s lease leaves a runner 333 ms of slack (the detach margin):
	// under the race detector, which slows a runner five- to tenfold, on a
	// loaded machine, runners detached again and again and the singletons
	// never settled in 3 minutes. There the lease is the default, 5 s.
	ttl := "1s"
	if raceEnabled {
		ttl = runner.DefaultLeaseTTL.String()
	}
	tiny := []string{"-runners", "2", "-shards", "16", "-singletons", "6", "-ttl", ttl}
	for _, tc := range []struct {
		scenario string
		args     []string
		// each pattern's first group must be a number > 0 (or the
		// pattern just match, without a group)
		want []string
	}{
		{"handover", []string{"-rounds", "1"}, []string{
			`: (\d+) singleton handovers`, `overlaps 0 \(all runs: 0\)`,
			`ShardAcquired -> new start.*p50 \d+\.\d ms`,
		}},
		{"crash", []string{"-repeat", "1", "-crash-remembered", "60", "-singletons", "20"}, []string{
			`Close in this process.*\n.*stop 1 \(v1: (\d+) shards`, `SIGKILL.*\n.*stop 1 \(v1: (\d+) shards`,
			`its singletons running again \+(\d+)\.\d ms, all its remembered entities \+(\d+)\.\d ms`,
			`singleton overlaps 0\n(?s:.*)singleton overlaps 0\n`,
		}},
		{"restart", []string{"-restart", "200", "-rates", "0,5000"}, []string{
			`all 200 activated \+(\d+)\.\d ms`, `RememberedStartRate 5000/s`,
		}},
		{"writes", []string{"-entities", "100", "-messages", "1000", "-quiet", "300ms"}, []string{
			`(\d+) of them writing 100 markers`, `1000 messages to them .*: 0 etcd writes \(0 touching markers\)`,
			`0 of them touching markers \(0 events\); 100 markers stored`,
		}},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			var out bytes.Buffer
			args := append(append([]string{"-scenario", tc.scenario}, tiny...), tc.args...)
			if code := run(args, &out, &out); code != 0 {
				t.Fatalf("run %v: exit %d\n%s", args, code, out.String())
			}
			scenario.Expect(t, out.String(), tc.want)
			t.Log("\n" + out.String())
		})
	}
}

// TestBadFlagsAreRefused: an unknown scenario, a crash mode or a rate
// that does not parse end with exit status 2 and a message.
func TestBadFlagsAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"-scenario", "nope"}, {"-crash", "close,stop"}, {"-rates", "fast"}, {"-runners", "1"}, {"-quiet", "0s"},
	} {
		var out bytes.Buffer
		if code := run(args, &out, &out); code != 2 || out.Len() == 0 {
			t.Errorf("run(%v) = %d with %q, want 2 and a message", args, code, out.String())
		}
	}
}
