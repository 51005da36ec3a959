package runner

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardhost/shardhost/detachment"
	"github.com/shardhost/shardhost/runner/internal/handoff"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/tracing"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Traces of the lifecycle work (see "Traces" in the package doc): each
// side of a shard's handoff, a detach and a re-attachment is a root span
// of its own (no request causes it), made only while tracing is on
// (l.trace.On, the one switch) and built only when it records (sampled
// in). A span handled here is nil when it does not record: the control
// loop then tests one nil per shard.
//
//   - "handoff warm", the new owner's side of one shard's handoff: from
//     the takeover's start to the lock's arrival (outcome cutover), the
//     lock acquired after the old owner's lease ended (acquired), or the
//     takeover abandoned (aborted: an error status, its error.type says
//     why). Its span rides in the takeover's context (handoff.Inbound),
//     so the WarmShard and Warm hooks it runs are its children.
//   - "handoff release", the old owner's side: from admission stopped to
//     the lock moved (cutover), or the cutover given up (aborted).
//   - "detach": from the detach to the moment the interrupted shards' last
//     handler returned (bounded by DrainTimeout).
//   - "reattach": one re-attachment (registration, epochs of the locks
//     kept under a surviving lease bumped), linked to the detach span.

// handoffWarmSpan and the other names of the lifecycle spans
// (tracing.LifecycleSpans lists them for the documentation test).
const (
	handoffWarmSpan    = "handoff warm"
	handoffReleaseSpan = "handoff release"
	detachSpan         = "detach"
	reattachSpan       = "reattach"
)

// The outcomes of the handoff spans (shardhost.outcome).
const (
	outcomeCutover  = "cutover"
	outcomeAcquired = "acquired"
	outcomeAborted  = "aborted"
)

// The error.type of handoff spans that ended without moving the lock.
const (
	abortDetached    = "detached"
	abortShutdown    = "shutdown"
	abortAbandoned   = "abandoned" // reassigned, or the old owner changed or rewrote its lock
	abortWarmTimeout = "warm_timeout"
	abortRecord      = "record_failed"
	abortBusy        = "handlers_running"
	abortProgress    = "progress_unrecorded"
	abortTransfer    = "transfer_failed"
	abortUnknown     = "transfer_unknown"
	abortLockLost    = "lock_lost"
)

// maxSpanShards bounds the shard IDs listed in one span attribute
// (shardhost.shards); shardhost.shard_count has them all.
const maxSpanShards = 1024

// lifeEvent adds event name to span (nil: not recording).
func lifeEvent(span trace.Span, name string, attrs ...attribute.KeyValue) {
	if span != nil {
		span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// endLife ends span (nil: not recording) with outcome; errType (non-empty)
// makes it an error, described by desc.
func endLife(span trace.Span, outcome, errType, desc string) {
	if span == nil {
		return
	}
	if outcome != "" {
		span.SetAttributes(tracing.KeyOutcome.String(outcome))
	}
	if errType != "" {
		span.SetAttributes(tracing.KeyErrorType.String(errType))
		span.SetStatus(codes.Error, desc)
	}
	span.End()
}

// startLife starts a lifecycle root span from ctx and returns its context
// and the span, nil unless it records (the caller then builds its
// attributes: none are built for a span sampled out).
func (l *lifeTracer) startLife(ctx context.Context, name string, opts []trace.SpanStartOption) (context.Context, trace.Span) {
	sctx, span := l.trace.Start(ctx, name, opts...)
	if !span.IsRecording() {
		span.End()
		return ctx, nil
	}
	span.SetAttributes(l.trace.Runner())
	return sctx, span
}

// inboundContext returns the context of a new takeover of shard id from
// its owner from at fromEpoch: under parent, carrying the takeover's warm
// span when tracing is on.
func (l *lifeTracer) inboundContext(parent context.Context, id sharding.ShardID, from storage.Runner, fromEpoch storage.Epoch) context.Context {
	if !l.trace.On() {
		return parent
	}
	ctx, span := l.startLife(parent, handoffWarmSpan, tracing.RootSpan)
	if span != nil {
		span.SetAttributes(tracing.KeyShard.Int64(int64(id)), tracing.KeyPeer.String(from.ID), tracing.KeyPeerEpoch.Int64(int64(fromEpoch)))
	}
	return ctx
}

// inboundSpan returns the warm span of takeover in (nil: none recording).
func (l *lifeTracer) inboundSpan(in *handoff.Inbound) trace.Span {
	if !l.trace.On() {
		return nil
	}
	if span := trace.SpanFromContext(in.Context()); span.IsRecording() {
		return span
	}
	return nil
}

// traceInbound records phase to of takeover in, reported with detail
// (errType: the error.type of an abort).
func (l *lifeTracer) traceInbound(in *handoff.Inbound, to handoff.Phase, detail, errType string) {
	span := l.inboundSpan(in)
	if span == nil {
		return
	}
	switch to {
	case handoff.Warming:
		lifeEvent(span, tracing.EventWarming)
	case handoff.Ready:
		lifeEvent(span, tracing.EventReady)
	case handoff.Aborted:
		endLife(span, outcomeAborted, cmp.Or(errType, abortAbandoned), detail)
	}
}

// endInbound ends the warm span of takeover in, which ended with outcome
// (cutover or acquired) at epoch with warmed entities warmed.
func (l *lifeTracer) endInbound(in *handoff.Inbound, outcome string, epoch storage.Epoch, warmed int) {
	if span := l.inboundSpan(in); span != nil {
		span.SetAttributes(tracing.KeyEpoch.Int64(int64(epoch)), tracing.KeyWarmed.Int(warmed))
		endLife(span, outcome, "", "")
	}
}

// startOutbound starts the release spans of the cutover items.
func (l *lifeTracer) startOutbound(items []cutoverItem) {
	if !l.trace.On() {
		return
	}
	for i := range items {
		it := &items[i]
		_, it.span = l.startLife(context.Background(), handoffReleaseSpan, tracing.RootSpan)
		if it.span != nil {
			it.span.SetAttributes(tracing.KeyShard.Int64(int64(it.s.id)), tracing.KeyEpoch.Int64(int64(it.s.epoch)), tracing.KeyPeer.String(it.h.To))
			lifeEvent(it.span, tracing.EventAdmissionStopped)
		}
	}
}

// outboundEvent adds event name to the release span of each item.
func outboundEvent(items []cutoverItem, name string) {
	for _, it := range items {
		lifeEvent(it.span, name)
	}
}

// detachType is the error.type of a detach span by reason.
func detachType(reason detachment.Reason) string {
	switch reason {
	case detachment.ReasonLeaseDeadline:
		return "lease_deadline"
	case detachment.ReasonKeepAliveStreak:
		return "keepalive_streak"
	case detachment.ReasonStorageError:
		return "storage_error"
	case detachment.ReasonLeaseLost:
		return "lease_lost"
	case detachment.ReasonLockLost:
		return "lock_lost"
	case detachment.ReasonManual:
		return "manual"
	}
	return "detached"
}

// shardList returns the shardhost.shards and shardhost.shard_count
// attributes of ids (sorted in place).
func shardList(ids []sharding.ShardID) []attribute.KeyValue {
	slices.Sort(ids)
	n := len(ids)
	list := make([]int64, min(n, maxSpanShards))
	for i := range list {
		list[i] = int64(ids[i])
	}
	return []attribute.KeyValue{tracing.KeyShards.Int64Slice(list), tracing.KeyShardCount.Int(n)}
}

// lifeTracer makes the lifecycle spans (nil spans while tracing is off or
// they are sampled out) and ends those that wait for handlers in
// goroutines of its own, which Run waits for (wait).
type lifeTracer struct {
	trace        *tracing.Tracer // the runner's (tracing.go)
	drainTimeout time.Duration   // the longest a detach span waits for its handlers
	spans        sync.WaitGroup  // goroutines ending spans
	stop         chan struct{}   // closed by wait: they end their spans at once

	mu     sync.Mutex
	detach trace.SpanContext // the last detach span's (a re-attachment's link)
}

func newLifeTracer(tr *tracing.Tracer, drainTimeout time.Duration) *lifeTracer {
	return &lifeTracer{trace: tr, drainTimeout: drainTimeout, stop: make(chan struct{})}
}

// wait ends the spans still waiting for handlers and waits for their
// goroutines (the end of Run).
func (l *lifeTracer) wait() {
	close(l.stop)
	l.spans.Wait()
}

// traceDetach starts the span of a detach for reason (detail) with
// the lease deadline, interrupting the shards hosts, and ends it once
// their handlers returned (bounded by DrainTimeout and the end of Run),
// in a goroutine of l.spans.
func (l *lifeTracer) traceDetach(reason detachment.Reason, detail string, deadline time.Time, hosts []*hosting.Shard) {
	if !l.trace.On() {
		return
	}
	_, span := l.startLife(context.Background(), detachSpan, tracing.RootSpan)
	l.mu.Lock()
	if span == nil {
		l.detach = trace.SpanContext{}
	} else {
		l.detach = span.SpanContext()
	}
	l.mu.Unlock()
	if span == nil {
		return
	}
	ids := make([]sharding.ShardID, len(hosts))
	for i, h := range hosts {
		ids[i] = h.ID()
	}
	span.SetAttributes(shardList(ids)...)
	span.SetAttributes(tracing.KeyDetachReason.String(reason.String()), tracing.KeyLeaseDeadline.String(deadline.UTC().Format(time.RFC3339Nano)))
	span.SetAttributes(tracing.KeyErrorType.String(detachType(reason)))
	span.SetStatus(codes.Error, fmt.Sprintf("detached (%s): %s", reason, detail))
	l.spans.Go(func() {
		running := l.waitStopped(hosts)
		lifeEvent(span, tracing.EventEntitiesStopped, tracing.KeyRunning.Int(running))
		span.End()
	})
}

// waitStopped waits until no handler of hosts runs, at most DrainTimeout
// and no longer than Run; it returns how many still run.
func (l *lifeTracer) waitStopped(hosts []*hosting.Shard) int {
	limit := time.NewTimer(l.drainTimeout)
	defer limit.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		n := 0
		for _, h := range hosts {
			n += int(h.Running())
		}
		if n == 0 {
			return 0
		}
		select {
		case <-limit.C:
			return n
		case <-l.stop:
			return n
		case <-tick.C:
		}
	}
}

// startReattach starts the span of a re-attachment attempt (nil: not
// recording) under lease leaseID (newLease: granted for it), linked to
// the last detach span.
func (l *lifeTracer) startReattach(leaseID storage.LeaseID, newLease bool) trace.Span {
	if !l.trace.On() {
		return nil
	}
	l.mu.Lock()
	link := l.detach
	l.mu.Unlock()
	opts := tracing.RootSpan
	if link.IsValid() {
		opts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: link})}
	}
	_, span := l.startLife(context.Background(), reattachSpan, opts)
	if span != nil {
		span.SetAttributes(tracing.KeyLease.String(fmt.Sprintf("%x", leaseID)), tracing.KeyLeaseNew.Bool(newLease))
	}
	return span
}

// endReattach ends a re-attachment's span (nil: not recording): failed
// with err, or attached with the shards kept installed again at new
// epochs.
func endReattach(span trace.Span, kept []storage.AcquireResult, err error) {
	if span == nil {
		return
	}
	if err != nil {
		endLife(span, "", "reattach_failed", err.Error())
		return
	}
	ids := make([]sharding.ShardID, 0, len(kept))
	for _, a := range kept {
		if a.Status == storage.Acquired {
			ids = append(ids, a.Shard)
		}
	}
	span.SetAttributes(shardList(ids)...)
	span.End()
}
