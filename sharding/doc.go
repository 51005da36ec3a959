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
// An [Strategy] computes, for a set of runners with weights, which runner
// each shard is assigned to. Assignments are advisory: a runner owns a shard
// only while it holds the shard's lock in storage. Strategies differ in how
// many shards they move when the runner set changes and how evenly they
// spread them; see each strategy's documentation.
package sharding
