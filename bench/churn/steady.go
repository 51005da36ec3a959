package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// SteadyReport is the cost of a settled cluster with no load and no churn:
// what the control plane spends to stay as it is.
type SteadyReport struct {
	Window float64 `json:"window_s"`
	// CPU of the hosting runners per runner, in percent of one core (see
	// StepCost for how it is split from the rest); of the gateway (no
	// callers ask meanwhile; -loadproc=false: counted with the runners');
	// and of the etcd server (when the harness started it).
	RunnerCPUPercent  float64 `json:"runner_cpu_percent"`
	GatewayCPUPercent float64 `json:"gateway_cpu_percent,omitempty"`
	EtcdCPUPercent    float64 `json:"etcd_cpu_percent,omitempty"`
	// Writes seen by etcd per second (from its /metrics): key puts and
	// deletes, and raft proposals committed (every write; lease renewals
	// are not proposals).
	PutsPerSec       float64 `json:"etcd_puts_per_s"`
	DeletesPerSec    float64 `json:"etcd_deletes_per_s"`
	ProposalsPerSec  float64 `json:"etcd_proposals_per_s"`
	KeepAlivesPerSec float64 `json:"etcd_lease_renewals_per_s,omitempty"`
	// Unary requests etcd handled (verifications, mostly) and watch events
	// it sent, per second: a step's cost includes them for its duration.
	RequestsPerSec    float64 `json:"etcd_requests_per_s"`
	WatchEventsPerSec float64 `json:"etcd_watch_events_per_s"`
	// RequestsByMethod splits RequestsPerSec by gRPC method (Range, Txn,
	// LeaseTimeToLive...), the methods with none left out.
	RequestsByMethod map[string]float64 `json:"etcd_requests_per_s_by_method,omitempty"`
}

// etcd /metrics counters read for the steady report.
const (
	metricPuts       = "etcd_mvcc_put_total"
	metricDeletes    = "etcd_mvcc_delete_total"
	metricProposals  = "etcd_server_proposals_committed_total"
	metricKeepAlives = `grpc_server_handled_total{grpc_code="OK",grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"}`
	// Sums over several series (StepCost): the unary gRPC calls handled,
	// of them Txn, and the events sent to watchers.
	metricUnary       = "sum: unary requests"
	metricTxns        = "sum: txns"
	metricWatchEvents = "etcd_debugging_mvcc_events_total"
	metricWatchers    = "etcd_debugging_mvcc_watcher_total" // watchers etcd holds (BenchmarkEtcdWatchCost)
	// metricMethod prefixes the unary calls handled of one gRPC method.
	metricMethod = "method: "
)

// measureSteady measures the settled cluster over window (see SteadyReport).
func (h *harness) measureSteady(ctx context.Context, window time.Duration, runners int) (SteadyReport, error) {
	rep := SteadyReport{Window: window.Seconds()}
	c0 := h.markCost(ctx)
	if c0.m == nil {
		_, err := etcdMetrics(ctx, h.etcd.Endpoint)
		return rep, err
	}
	t0 := time.Now()
	if !sleepUntil(ctx, t0.Add(window)) {
		return rep, context.Cause(ctx)
	}
	el := time.Since(t0)
	c := h.costSince(ctx, c0, runners)
	m0 := c0.m
	m1, err := etcdMetrics(ctx, h.etcd.Endpoint)
	if err != nil {
		return rep, err
	}
	pct := func(s float64) float64 { return 100 * s / el.Seconds() }
	rep.RunnerCPUPercent = pct(c.RunnersCPU) / float64(runners)
	rep.GatewayCPUPercent, rep.EtcdCPUPercent = pct(c.LoadCPU), pct(c.EtcdCPU)
	rate := func(name string) float64 { return (m1[name] - m0[name]) / el.Seconds() }
	rep.PutsPerSec, rep.DeletesPerSec, rep.ProposalsPerSec = rate(metricPuts), rate(metricDeletes), rate(metricProposals)
	rep.KeepAlivesPerSec = rate(metricKeepAlives)
	rep.RequestsPerSec, rep.WatchEventsPerSec = rate(metricUnary), rate(metricWatchEvents)
	for name := range m1 {
		if method, ok := strings.CutPrefix(name, metricMethod); ok {
			if r := rate(name); r > 0 {
				if rep.RequestsByMethod == nil {
					rep.RequestsByMethod = map[string]float64{}
				}
				rep.RequestsByMethod[method] = r
			}
		}
	}
	return rep, nil
}

// processCPU returns the CPU time (user + system) this process used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// etcdCPU returns the CPU time of the etcd child (from /proc; -1 when the
// harness did not start it or /proc is not readable).
func (h *harness) etcdCPU() time.Duration {
	if h.etcd.member == nil {
		return -1
	}
	return pidCPU(h.etcd.member.PID())
}

// pidCPU reads the user + system CPU time of process pid from
// /proc/pid/stat (-1 if unreadable).
func pidCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// The command name (field 2) may hold spaces: fields count from the
	// last ')'. utime and stime are fields 14 and 15, in clock ticks.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return -1
	}
	ut, err1 := strconv.ParseInt(fields[11], 10, 64)
	st, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / ticksPerSecond
}

// etcdMetrics reads the counters of etcd's /metrics (Prometheus text) that
// the steady report and the step costs use.
func etcdMetrics(ctx context.Context, endpoint string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("etcd metrics: %w", err)
	}
	defer resp.Body.Close()
	want := map[string]bool{metricPuts: true, metricDeletes: true, metricProposals: true, metricKeepAlives: true, metricWatchEvents: true, metricWatchers: true}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		if want[name] {
			out[name] = v
		}
		if strings.HasPrefix(name, "grpc_server_handled_total{") && strings.Contains(name, `grpc_type="unary"`) {
			out[metricUnary] += v
			if strings.Contains(name, `grpc_method="Txn"`) {
				out[metricTxns] += v
			}
			if _, m, ok := strings.Cut(name, `grpc_method="`); ok {
				if m, _, ok := strings.Cut(m, `"`); ok {
					out[metricMethod+m] += v
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("etcd metrics: %w", err)
	}
	return out, nil
}
