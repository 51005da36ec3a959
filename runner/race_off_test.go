//go:build !race

package runner_test

// raceEnabled: the test binary runs under the race detector.
const raceEnabled = false
