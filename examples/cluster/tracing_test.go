//go:build linux

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
)

// exportedSpan is a span as -traces writes it (stdouttrace's JSON).
type exportedSpan struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
	SpanKind    int // trace.SpanKind: 1 internal, 2 server, 3 client
	Attributes  []struct {
		Key   string
		Value struct{ Value any }
	}
	proc string // the file it came from
}

func (s exportedSpan) attr(key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return fmt.Sprint(kv.Value.Value)
		}
	}
	return ""
}

// readSpans reads the spans a process exported to file.
func readSpans(t *testing.T, file, proc string) []exportedSpan {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []exportedSpan
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var s exportedSpan
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("%s: %v: %s", file, err, sc.Bytes())
		}
		s.proc = proc
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestClusterTracesCrossProcesses runs the gateway and two runners as
// processes, each exporting every span to its own file (-traces,
// -trace-ratio 1): each ask the gateway sent is one trace spanning two
// processes — the gateway's client span, the server span of the runner
// that served it (its child, in that runner's file) and the handler's
// span (the server span's child) — and the asks' traces cover all three
// processes.
func TestClusterTracesCrossProcesses(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	dir := t.TempDir()
	bin := goBuild(t, dir, "cluster", ".")
	ids := []string{"runner-1", "runner-2"}
	common := []string{"-etcd", etcd.Endpoint(), "-namespace", "traced", "-shards", "64", "-trace-ratio", "1"}
	debug := map[string]string{}
	procs := map[string]*proc{}
	for _, id := range append(ids, "gateway") {
		addr := testenv.FreeAddr(t)
		debug[id] = "http://" + addr + DebugPath
		args := append([]string{"-id", id, "-debug", addr, "-traces", filepath.Join(dir, id+".jsonl")}, common...)
		if id == "gateway" {
			args = append(args, "-role", "gateway", "-rate", "40", "-entities", "200", "-report", "500ms")
		} else {
			args = append(args, "-role", "runner")
		}
		procs[id] = start(t, dir, bin, id, args...)
	}
	waitState(t, debug["gateway"], 60*time.Second, "2 attached runners owning every shard, seen by the gateway", healthy(ids...))
	waitState(t, debug["runner-1"], 20*time.Second, "traffic handled on every runner", func(st runner.DebugState) bool {
		for _, r := range st.Runners {
			if r.State == nil || r.State.Messages < 20 {
				return false
			}
		}
		return healthy(ids...)(st)
	})
	// Stop gracefully: each process flushes its spans as it exits.
	for _, id := range append([]string{"gateway"}, ids...) {
		p := procs[id]
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not stop within 30 s of SIGTERM", id)
		}
	}

	byTrace := map[string][]exportedSpan{}
	for _, id := range append(ids, "gateway") {
		for _, s := range readSpans(t, filepath.Join(dir, id+".jsonl"), id) {
			byTrace[s.SpanContext.TraceID] = append(byTrace[s.SpanContext.TraceID], s)
		}
	}
	asks, served := 0, map[string]int{}
	for id, spans := range byTrace {
		var client *exportedSpan
		for i, s := range spans {
			if s.SpanKind == 3 && s.proc == "gateway" && s.Parent.SpanID == "0000000000000000" {
				client = &spans[i]
			}
		}
		if client == nil {
			continue // the runners' own traces (none here: counters send nothing)
		}
		if client.attr("rpc.system") != "shardhost" || client.Name != "counter/inc" {
			t.Errorf("trace %s: the gateway's root span is %q with rpc.system %q", id, client.Name, client.attr("rpc.system"))
		}
		if client.attr("error.type") != "" {
			continue // a failed ask (none expected; the gateway's log counts them)
		}
		// Each attempt that reached a runner is a server span, the
		// client span's child; the handler's span is the child of the
		// last one's, in the same process.
		var server, handler *exportedSpan
		for i, s := range spans {
			if s.SpanKind == 1 && strings.HasPrefix(s.Name, "handle ") {
				handler = &spans[i]
			}
		}
		for i, s := range spans {
			if s.SpanKind != 2 {
				continue
			}
			if s.Parent.SpanID != client.SpanContext.SpanID || s.proc == "gateway" {
				t.Errorf("trace %s: server span %+v is not a runner's child of the gateway's client span %+v", id, s, *client)
			}
			if handler != nil && handler.Parent.SpanID == s.SpanContext.SpanID {
				server = &spans[i]
			}
		}
		if server == nil || handler.proc != server.proc {
			t.Errorf("trace %s: spans %+v; want the gateway's client span, a runner's server span its child, the handler's span the server span's child", id, spans)
			continue
		}
		asks++
		served[server.proc]++
	}
	t.Logf("%d traces, %d asks traced across processes, served by %v", len(byTrace), asks, served)
	if asks < 20 || served["runner-1"] == 0 || served["runner-2"] == 0 {
		t.Errorf("%d asks traced across processes, served by %v: want at least 20, on both runners", asks, served)
	}
}
