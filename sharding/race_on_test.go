//go:build race

package sharding

// raceEnabled: the test binary runs under the race detector.
const raceEnabled = true
