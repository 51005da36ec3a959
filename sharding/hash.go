package sharding

import "math"

// The ranking hashes below are part of the cluster contract, like [ShardOf]:
// every runner computes the assignment on its own, so all versions and
// platforms in a fleet must compute the same values. Floating-point code here
// converts every product explicitly to float64, which forbids the compiler to
// fuse it into an FMA (allowed by the Go spec, done on arm64 and GOAMD64=v3),
// and does not use package math's Log, whose result differs between
// platforms (assembly on amd64 and s390x).

// golden is 2^64 / phi, the increment of the splitmix64 generator.
const golden = 0x9e3779b97f4a7c15

// mix64 is the splitmix64 finalizer: a bijection of uint64 with full
// avalanche (every input bit flips each output bit with probability ~1/2).
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// shardKey is the hash of shard s that the strategies combine with a runner.
func shardKey(s int) uint64 { return mix64(uint64(s+1) * golden) }

// runnerKey is the hash of a runner ID that the strategies combine with a shard.
func runnerKey(id string) uint64 { return mix64(Hash64(id)) }

// pairHash is the rendezvous hash of the pair (runner, shard), given their keys.
func pairHash(rk, sk uint64) uint64 { return mix64(rk ^ sk) }

// weightedScore is the weighted rendezvous score w / -ln(u) of a pair whose
// hash h defines the uniform variate u in (0, 1). The runner with the highest
// score wins; a runner of weight w wins a shard with probability w / sum(w).
// The score is positive and finite, so its IEEE-754 bits order like the score.
func weightedScore(h uint64, w float64) float64 {
	return w / -lnUnit(unitVariate(h))
}

// unitVariate maps a 64-bit hash to the uniform variate u in (0, 1) the
// scores use: exact (52 bits and a half), 2^-53 <= u <= 1 - 2^-53.
func unitVariate(h uint64) float64 { return (float64(h>>12) + 0.5) * 0x1p-52 }

// lnUnit returns ln(x) for 0 < x < 1, x normal, with a relative error below
// 1e-13 and a result that is negative, finite and the same on every platform.
func lnUnit(x float64) float64 {
	// x = f * 2^k with f in [sqrt(2)/2, sqrt(2)); ln(x) = k*ln(2) + ln(f) and
	// ln(f) = 2*atanh(s) = 2*(s + s^3/3 + s^5/5 + ...), s = (f-1)/(f+1),
	// |s| <= 0.1716: the terms up to s^15 leave an error below 2e-14.
	b := math.Float64bits(x)
	k := int(b>>52&0x7ff) - 1023
	f := math.Float64frombits(b&(1<<52-1) | 1023<<52) // in [1, 2)
	if f >= math.Sqrt2 {
		f *= 0.5 // exact
		k++
	}
	s := (f - 1) / (f + 1) // f-1 is exact
	z := float64(s * s)
	p := 1.0 / 15
	p = float64(z*p) + 1.0/13
	p = float64(z*p) + 1.0/11
	p = float64(z*p) + 1.0/9
	p = float64(z*p) + 1.0/7
	p = float64(z*p) + 1.0/5
	p = float64(z*p) + 1.0/3
	p = float64(z*p) + 1
	lnf := float64(float64(2*s) * p)
	return float64(float64(k)*math.Ln2) + lnf
}
