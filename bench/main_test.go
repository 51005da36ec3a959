package bench

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
)

// TestMain lets the test binary run as a runner process (runnerproc) for
// TestCrashFailover, and checks for leaked goroutines.
func TestMain(m *testing.M) {
	runnerproc.Main()
	goleak.VerifyTestMain(m)
}
