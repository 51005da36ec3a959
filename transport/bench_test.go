package transport

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// processCPU is the CPU time (user and system) the process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ioSyscalls is the number of read and write system calls the process
// made so far (/proc/self/io; 0 where there is none).
func ioSyscalls() int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	var n int64
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok && (k == "syscr" || k == "syscw") {
			x, _ := strconv.ParseInt(v, 10, 64)
			n += x
		}
	}
	return n
}

// BenchmarkGRPCCall: callers deliver 64-byte requests over loopback TCP to
// a transport that echoes them — the transport alone, without routing,
// hosting or a codec. It reports the latency percentiles, the calls per
// second and the CPU time of both ends per call (cpu-µs/op: less
// sensitive than the others to what else the machine runs).
func BenchmarkGRPCCall(b *testing.B) {
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			server := NewGRPC(GRPCConfig{ListenAddr: "127.0.0.1:0", Logger: quiet()})
			addr, err := server.Listen(echoHandler{})
			if err != nil {
				b.Fatal(err)
			}
			defer server.Close(0)
			client := NewGRPC(GRPCConfig{Logger: quiet()})
			defer client.Close(0)
			payload := make([]byte, 64)
			req := func() *DeliverRequest {
				return &DeliverRequest{Kind: "counter", Method: "inc", Entity: "e1", Payload: payload, Shard: 7, Sender: "client", Codec: "json"}
			}
			ctx := context.Background()
			for range 100 { // connect and warm up
				if _, _, err := client.Call(ctx, addr, req()); err != nil {
					b.Fatal(err)
				}
			}
			var (
				mu   sync.Mutex
				lat  []time.Duration
				next = make(chan struct{}, callers)
				wg   sync.WaitGroup
			)
			cpu0, sys0 := processCPU(), ioSyscalls()
			b.ResetTimer()
			for range callers {
				wg.Go(func() {
					local := make([]time.Duration, 0, b.N/callers+1)
					for range next {
						t0 := time.Now()
						resp, _, err := client.Call(ctx, addr, req())
						if err != nil || len(resp.Payload) != len(payload) {
							b.Errorf("Call = %v, %v", resp, err)
							break
						}
						local = append(local, time.Since(t0))
					}
					mu.Lock()
					lat = append(lat, local...)
					mu.Unlock()
				})
			}
			for range b.N {
				next <- struct{}{}
			}
			close(next)
			wg.Wait()
			b.StopTimer()
			cpu, sys := processCPU()-cpu0, ioSyscalls()-sys0
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
			b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/op")
			b.ReportMetric(float64(sys)/float64(b.N), "rw-syscalls/op")
		})
	}
}
