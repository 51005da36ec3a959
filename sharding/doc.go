// Package sharding maps entity IDs to shards and shards to runners.
//
// It is pure: no goroutines, no I/O, no logging, stdlib only. Every function
// is deterministic for the same input and safe for concurrent use.
//
// # Entity to shard
//
// A cluster has a fixed number of shards N (see [ValidateNumShards]). An
// entity ID is mapped to a shard with [ShardOf]:
//
//	shard = FNV-1a-64(utf8 bytes of entityID) mod N
//
// FNV-1a-64 uses offset basis 14695981039346656037 and prime 1099511628211
// (see hash/fnv). The mapping is part of the wire contract: changing it, or
// changing N for a live cluster, moves every entity.
//
// # Shard to runner
//
// A [Strategy] computes, for a set of runners with weights, which runner
// each shard is assigned to. Assignments are advisory: a runner owns a shard
// only while it holds the shard's lock in storage. Strategies differ in how
// many shards they move when the runner set changes and how evenly they
// spread them; see each strategy's documentation.
//
// Every strategy is deterministic, independent of the order of
// [Input.Runners], and gives nothing to runners of weight 0 (draining). The
// ranking hashes (splitmix64 over [Hash64] of the runner ID and the shard
// number) and the floating-point arithmetic of weighted rendezvous are fixed
// and platform-independent, so runners of one fleet agree on the assignment
// whatever their architecture. Like ShardOf, they are part of the contract:
// changing them makes old and new runners disagree during a rolling upgrade.
//
// The strategies, for N shards and M runners of weight > 0 (W total weight):
//
//   - [Balanced] (the [Default]): depends on the runner set only. Exact loads:
//     each runner gets floor or ceil of N*w/W, so equal weights differ by at
//     most one shard. A join or leave moves the necessary shards plus a load
//     correction of up to about sqrt(N) shards.
//   - [StickyBalanced]: the loads of Balanced, reached from [Input.Current]
//     with the fewest possible moves: a join moves exactly the joiner's
//     quota, a leave exactly the leaver's shards. All runners must compute
//     it from the same Current to agree.
//   - [Rendezvous]: weighted highest random weight. Only the necessary shards
//     move, but loads vary binomially (a runner's count is N*w/W ± about
//     sqrt(N*w/W)).
//   - [JumpHash]: jump consistent hash over runners numbered 0..M-1 by the
//     ordinal their ID ends in; weights are ignored. Only the necessary
//     shards move when the highest ordinal joins or leaves; loads vary like
//     Rendezvous.
//
// Shards moved on a join or a leave relative to the optimum (the joiner's
// share N/(M+1) / the leaver's shards) are measured by TestMovement (go test
// -v -run Movement ./sharding) and listed in BENCHMARKS.md ("Acquisition,
// assignment and memory"): Balanced moves up to 3.65x the optimum at 1024
// shards and 100 runners, 1.68x at 16384; StickyBalanced the minimum.
//
// Rendezvous and JumpHash move exactly the joiner's or the leaver's shards;
// the joiner's share itself varies around N/(M+1).
//
// All strategies cost O(N*M) hash evaluations; Balanced assigns 16384
// shards to 100 runners in a few milliseconds. A [Planner] computes a
// sequence of assignments (a runner's view of the membership as it
// changes) with the same results: for Balanced, a change of a few runners
// then costs O(N) instead (BenchmarkPlanner; figures in BENCHMARKS.md).
package sharding
