package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
)

func TestMain(m *testing.M) {
	runnerproc.Main() // a runner child: runs and exits
	goleak.VerifyTestMain(m)
}
