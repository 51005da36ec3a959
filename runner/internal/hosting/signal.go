package hosting

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/shardhost/shardhost/sharding"
)

// signalLogEvery is how often the failures of one signal are logged at
// WARN; the ones in between are counted in the next line (suppressed).
const signalLogEvery = 10 * time.Second

// signalLog rate-limits the WARN lines of failed signal handlers, per kind
// and signal.
type signalLog struct {
	mu   sync.Mutex
	last map[[2]string]*signalLogEntry
}

type signalLogEntry struct {
	at         time.Time
	suppressed int
}

// signalFailed reports a signal handler's error (a signal's sender has
// its answer already; ctx is its log records'): counted (SignalFailures) and logged at WARN, at
// most once per signalLogEvery per kind and signal with the count of
// those not logged.
func (h *Host) signalFailed(ctx context.Context, kind, method string, shard sharding.ShardID, err error) {
	h.met.SignalFailures.Add(context.Background(), 1, h.met.Attrs,
		metric.WithAttributes(attribute.String("kind", kind), attribute.String("method", method)))
	now := time.Now()
	l := &h.sigLog
	l.mu.Lock()
	if l.last == nil {
		l.last = make(map[[2]string]*signalLogEntry)
	}
	e := l.last[[2]string{kind, method}]
	if e == nil {
		e = &signalLogEntry{}
		l.last[[2]string{kind, method}] = e
	}
	if !e.at.IsZero() && now.Sub(e.at) < signalLogEvery {
		e.suppressed++
		l.mu.Unlock()
		return
	}
	n := e.suppressed
	e.at, e.suppressed = now, 0
	l.mu.Unlock()
	h.log.WarnContext(ctx, "signal handler failed", "kind", kind, "method", method, "shard", shard, "err", err,
		"suppressed", n, "every", signalLogEvery)
}
