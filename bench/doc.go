// Package bench holds shardhost's benchmarks that need real components (a
// real etcd started from ./bin, see `make setup`).
//
//	go test -run '^$' -bench . -benchtime 5x ./bench/
//
// BenchmarkAcquireCold measures one runner acquiring every shard of a cold
// cluster and reports the etcd transactions it took (counted on the wire
// with a gRPC interceptor). Strategy computation benchmarks live next to the
// strategies: go test -run '^$' -bench Assign ./sharding/.
//
// The churn harness, go run ./bench/churn (package bench/churn), measures
// settle times, cutover windows, ask outcomes and each step's cost (shards
// moved, etcd's watch deliveries and requests per moved shard, CPU of the
// runners, etcd and the callers apart) while runners join, shut down and
// crash under load on a real etcd; see BENCHMARKS.md.
package bench
