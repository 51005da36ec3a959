package sharding

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestLnUnit(t *testing.T) {
	xs := []float64{0x1p-53, 0x1p-52, 1e-10, 0.25, 0.5, math.Sqrt2 / 2, 0.7071067811865476, 0.75, 0.999999, 1 - 0x1p-53, 1 - 0x1p-52}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 100000 {
		xs = append(xs, unitVariate(rng.Uint64()))
	}
	for _, x := range xs {
		got, want := lnUnit(x), math.Log(x)
		if !(got < 0) || math.Abs(got-want) > 1e-13*math.Abs(want) {
			t.Errorf("lnUnit(%v) = %v, want %v (negative, relative error <= 1e-13)", x, got, want)
		}
	}
}

func TestWeightedScoreRange(t *testing.T) {
	for _, h := range []uint64{0, 1, 1 << 12, 1<<63 - 1, 1 << 63, math.MaxUint64 - 4095, math.MaxUint64} {
		for _, w := range []float64{1, 7, MaxWeight} {
			if s := weightedScore(h, w); !(s > 0) || math.IsInf(s, 0) {
				t.Errorf("weightedScore(%#x, %v) = %v, want positive and finite", h, w, s)
			}
		}
	}
	// Higher hash, higher score for the same weight; higher weight, higher score.
	if a, b := weightedScore(1<<62, 1), weightedScore(1<<63, 1); !(a < b) {
		t.Errorf("weightedScore(1<<62, 1) = %v, weightedScore(1<<63, 1) = %v, want increasing", a, b)
	}
	if a, b := weightedScore(1<<62, 1), weightedScore(1<<62, 2); !(a < b) {
		t.Errorf("weightedScore(1<<62, 1) = %v, weightedScore(1<<62, 2) = %v, want increasing", a, b)
	}
}

// TestRankingVectors pins the hashes that every runner must compute alike.
func TestRankingVectors(t *testing.T) {
	if got, want := mix64(0), uint64(0); got != want {
		t.Errorf("mix64(0) = %#x, want %#x", got, want)
	}
	if got, want := mix64(golden), uint64(0xe220a8397b1dcdaf); got != want {
		t.Errorf("mix64(golden) = %#x, want %#x (the first splitmix64 output for seed 0)", got, want)
	}
	tests := []struct {
		runner string
		shard  int
		hash   uint64
		score  float64 // weightedScore(hash, 3)
	}{
		{"runner-0", 0, 0x39699b31780b9a1d, 2.0068031007942513},
		{"runner-1", 1023, 0x10ff3e65055e9ff5, 1.1061384489010648},
		{"user/Zoë-東京", 1<<20 - 1, 0x56a30ed93f28b7a8, 2.7689297664368278},
	}
	for _, tt := range tests {
		h := pairHash(runnerKey(tt.runner), shardKey(tt.shard))
		if h != tt.hash {
			t.Errorf("pairHash(%q, %d) = %#x, want %#x", tt.runner, tt.shard, h, tt.hash)
		}
		if got := weightedScore(h, 3); got != tt.score {
			t.Errorf("weightedScore(pairHash(%q, %d), 3) = %v, want %v", tt.runner, tt.shard, got, tt.score)
		}
	}
}

// TestLnUnitBits pins the exact bits of lnUnit over many inputs, so that a
// platform or compiler that rounds differently (for example by fusing a
// multiply-add) fails here rather than splitting a fleet's assignments.
func TestLnUnitBits(t *testing.T) {
	var sum uint64
	for i := range 100000 {
		x := unitVariate(mix64(uint64(i)))
		sum = mix64(sum ^ math.Float64bits(lnUnit(x)))
	}
	if want := uint64(0x558c4c930908c434); sum != want {
		t.Errorf("hash of lnUnit over 100000 inputs = %#x, want %#x", sum, want)
	}
}
