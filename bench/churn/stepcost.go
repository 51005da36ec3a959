package main

import (
	"context"
	"slices"
	"time"
)

// StepCost is what one churn step cost, from its start to its settle: the
// CPU of this process (every in-process runner, the callers and the
// gateway; -procs: the runner processes too) and of etcd, the gRPC
// requests etcd handled, of them transactions, and the watch events it
// sent (one per event per watcher: what the watch fan-out costs). The
// steady report's rates say what a settled cluster spends meanwhile.
type StepCost struct {
	RunnerCPU   float64 `json:"runner_cpu_s"`
	PerRunner   float64 `json:"runner_cpu_per_runner_ms"` // RunnerCPU / the hosting runners after the step
	EtcdCPU     float64 `json:"etcd_cpu_s,omitempty"`
	Requests    float64 `json:"etcd_requests"` // unary calls: Range, Txn, Put, DeleteRange, lease grants and revokes
	Txns        float64 `json:"etcd_txns"`
	WatchEvents float64 `json:"etcd_watch_events"`
}

// costMark is the counters a step's cost is the difference of.
type costMark struct {
	cpu   time.Duration
	procs map[int]time.Duration
	etcd  time.Duration
	m     map[string]float64 // etcd's counters (nil: not readable)
}

func (h *harness) markCost(ctx context.Context) costMark {
	m, _ := etcdMetrics(ctx, h.etcd.Endpoint) // an etcd without /metrics: no request counts
	return costMark{cpu: processCPU(), procs: procsCPUByPID(h.live), etcd: h.etcdCPU(), m: m}
}

// costSince is the cost from mark c0 to now, with runners hosting runners
// after the step. (-procs: a runner process stopped by the step is not
// counted.)
func (h *harness) costSince(ctx context.Context, c0 costMark, runners int) StepCost {
	c1 := h.markCost(ctx)
	cpu := c1.cpu - c0.cpu + cpuSince(c0.procs, c1.procs)
	sc := StepCost{RunnerCPU: cpu.Seconds()}
	if runners > 0 {
		sc.PerRunner = 1000 * sc.RunnerCPU / float64(runners)
	}
	if c0.etcd >= 0 && c1.etcd >= 0 {
		sc.EtcdCPU = (c1.etcd - c0.etcd).Seconds()
	}
	if c0.m != nil && c1.m != nil {
		d := func(name string) float64 { return c1.m[name] - c0.m[name] }
		sc.Requests, sc.Txns, sc.WatchEvents = d(metricUnary), d(metricTxns), d(metricWatchEvents)
	}
	return sc
}

// medianCost is the median of each field over costs.
func medianCost(costs []StepCost) StepCost {
	med := func(f func(StepCost) float64) float64 {
		v := make([]float64, len(costs))
		for i, c := range costs {
			v[i] = f(c)
		}
		slices.Sort(v)
		if len(v) == 0 {
			return 0
		}
		return v[len(v)/2]
	}
	return StepCost{
		RunnerCPU:   med(func(c StepCost) float64 { return c.RunnerCPU }),
		PerRunner:   med(func(c StepCost) float64 { return c.PerRunner }),
		EtcdCPU:     med(func(c StepCost) float64 { return c.EtcdCPU }),
		Requests:    med(func(c StepCost) float64 { return c.Requests }),
		Txns:        med(func(c StepCost) float64 { return c.Txns }),
		WatchEvents: med(func(c StepCost) float64 { return c.WatchEvents }),
	}
}
