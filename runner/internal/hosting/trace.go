package hosting

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/tracing"
)

// Traces of the handlers (Config.Tracer). A message admitted while
// tracing is on carries a msgTrace; its handler runs in an internal span,
// with the activation it needed, if any, as a child span, and its context
// carries that span so the handler's own calls join the trace:
//
//   - an ask's and a signal's handler span is a child of the sender's
//     span (its client span, or the server span of the hop that brought
//     the message), so that a parent-based sampler keeps it exactly when
//     it keeps the sender's; a signal's carries its sender's baggage too;
//   - a timer's tick starts a new trace linked to the span of the handler
//     that started the timer (a periodic timer outlives that trace); a
//     reminder's (and a remembered entity's activation without a
//     message) start a new trace without a link, since a reminder
//     outlives any span: its registration is stored, the span context
//     that made it is not.
//
// A message without a msgTrace (tracing off) costs one nil test.

// msgTrace is the trace of one message.
type msgTrace struct {
	parent trace.SpanContext // a signal's sender (invalid: none; an ask's is in message.ctx)
	bag    baggage.Baggage   // a signal's sender's baggage
	link   trace.SpanContext // a timer's scheduler (invalid: none)
	span   trace.Span        // the handler's span (set by the entity's goroutine)
}

// traceOf returns the trace of a message admitted with ctx while tracing
// is on.
func traceOf(ctx context.Context, oneWay bool) *msgTrace {
	if oneWay { // a signal: its sender's ctx may end before it runs; keep what the handler needs
		return &msgTrace{parent: trace.SpanContextFromContext(ctx), bag: baggage.FromContext(ctx)}
	}
	return &msgTrace{} // an ask: a child of the asker's span (message.ctx)
}

// handlerNames are the names of handler spans, by handler.
var handlerNames tracing.Names[*entity.Handler]

// startSpan starts m's handler span (before its activation, if any).
func (e *resident) startSpan(m *message) {
	tr := e.host.h.cfg.Tracer
	parent, opts := e.ctx, tracing.InternalSpan
	switch {
	case m.ctx != nil:
		parent = m.ctx
	case m.tr.parent.IsValid():
		parent = trace.ContextWithSpanContext(e.ctx, m.tr.parent)
	case m.tr.link.IsValid():
		opts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithNewRoot(),
			trace.WithLinks(trace.Link{SpanContext: m.tr.link})}
	default:
		opts = tracing.RootSpan
	}
	var name string
	if m.h != nil {
		name = handlerNames.Get(m.h, func() string { return "handle " + m.h.Kind() + "/" + m.h.Name() })
	} else {
		name = "activate " + e.key.Kind
	}
	_, span := tr.Start(parent, name, opts...)
	if span.IsRecording() {
		attrs := e.spanAttrs(tracing.KeyRPCSystem.String(tracing.System), tracing.KeyEpoch.Int64(int64(e.host.epoch)))
		if m.h != nil {
			attrs = append(attrs, tracing.KeyRPCMethod.String(m.h.Name()))
			switch m.h.TickKind() {
			case entity.TimerHandler:
				attrs = append(attrs, tracing.KeyTick.String("timer"))
			case entity.ReminderHandler:
				attrs = append(attrs, tracing.KeyTick.String("reminder"))
			}
		}
		span.SetAttributes(attrs...)
	}
	m.tr.span = span
}

// spanAttrs returns the attributes of e's handler and activation spans
// (kind, entity, shard, runner) after extra, with room for two more (a
// handler's method and tick kind).
func (e *resident) spanAttrs(extra ...attribute.KeyValue) []attribute.KeyValue {
	out := make([]attribute.KeyValue, 0, len(extra)+6)
	out = append(out, extra...)
	return append(out, tracing.KeyRPCService.String(e.key.Kind), tracing.KeyEntity.String(tracing.Text(e.key.ID)),
		tracing.KeyShard.Int64(int64(e.host.id)), e.host.h.cfg.Tracer.Runner())
}

// endSpan ends m's handler span with the outcome err, if it has not
// ended yet.
func (m *message) endSpan(err error) {
	if m.tr.span != nil {
		tracing.End(m.tr.span, err, ErrorType)
		m.tr.span = nil
	}
}

// traceContext returns ctx carrying span, and, when it is sampled, the
// entity's runtime that links the timers it starts to span (a link to a
// span not exported would lead nowhere), and the sender's baggage.
func (e *resident) traceContext(ctx context.Context, m *message, span trace.Span) context.Context {
	ctx = trace.ContextWithSpan(ctx, span)
	if sc := span.SpanContext(); sc.IsSampled() {
		ctx = entity.WithRuntime(ctx, tracedRuntime{e, sc})
	}
	b := m.tr.bag
	if m.ctx != nil {
		b = baggage.FromContext(m.ctx)
	}
	if b.Len() > 0 {
		ctx = baggage.ContextWithBaggage(ctx, b)
	}
	return ctx
}

// logContext is the context of m's log records: carrying its handler's
// span, if traced, so that they carry its trace and span IDs.
func (m *message) logContext() context.Context {
	if m.tr == nil || m.tr.span == nil {
		return context.Background()
	}
	return trace.ContextWithSpan(context.Background(), m.tr.span)
}

// activateSpan starts the span of an activation, a child of m's handler
// span (an activation without a message has its own span already: its
// message's); it returns the Activate hook's context and the span to end
// (nil: none).
func (e *resident) activateSpan(m *message, reason entity.ActivateReason) (context.Context, trace.Span) {
	if m.tr == nil || m.tr.span == nil {
		return e.ctx, nil
	}
	if m.h == nil { // the message's own span is the activation's
		if m.tr.span.IsRecording() {
			m.tr.span.SetAttributes(tracing.KeyActivateReason.String(string(reason)), tracing.KeyActivateWarmed.Bool(e.inst != nil))
		}
		return e.traceContext(e.ctx, m, m.tr.span), nil
	}
	_, span := e.host.h.cfg.Tracer.Start(trace.ContextWithSpan(e.ctx, m.tr.span), "activate "+e.key.Kind, tracing.InternalSpan...)
	if span.IsRecording() {
		span.SetAttributes(e.spanAttrs(tracing.KeyActivateReason.String(string(reason)), tracing.KeyActivateWarmed.Bool(e.inst != nil))...)
	}
	return e.traceContext(e.ctx, m, span), span
}

// restored records the restore of an entity's checkpoint (n bytes, found
// or not, or failed with err) as an event of the span ctx carries: the
// activation's span when the Activate hook passes on its context, a
// handoff's warm span for a Warm hook.
func restored(ctx context.Context, n int, found bool, err error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{tracing.KeyRestoreFound.Bool(found), tracing.KeyRestoreBytes.Int(n)}
	if err != nil {
		attrs = append(attrs, tracing.KeyErrorType.String("restore_failed"))
	}
	span.AddEvent(tracing.EventRestore, trace.WithAttributes(attrs...))
}

// cutoverWait records, as an event of the span ctx carries (the sender's
// client span for a local send, the server span of a remote one), that a
// message waits at the old owner for the cutover of its shard to runner to.
func (sh *Shard) cutoverWait(ctx context.Context, to string) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(tracing.EventCutoverWait, trace.WithAttributes(tracing.KeyShard.Int64(int64(sh.id)), tracing.KeyPeer.String(to)))
	}
}

// tracedRuntime is the runtime of an entity as a traced handler sees it:
// the timers it starts are linked to the handler's span.
type tracedRuntime struct {
	*resident
	link trace.SpanContext
}

// StartTimer implements entity.Runtime.
func (t tracedRuntime) StartTimer(name string, h *entity.Handler, delay, period time.Duration, payload any) error {
	link := t.link
	return t.startTimer(name, h, delay, period, payload, &link)
}

// ErrorType classifies a delivery's outcome for the error.type attribute
// of its spans: a low-cardinality name ("" for nil). An outcome that may
// have run (a withheld result, ErrMaybeDelivered) says so first, then one
// the caller's context ended; an error of none of the runtime's kinds is
// the handler's.
func ErrorType(err error) string {
	if err == nil {
		return ""
	}
	var (
		stale *StaleResultError
		pe    *entity.PanicError
		no    *NotOwnerError
		ud    *UndeliveredError
	)
	switch {
	case errors.As(err, &stale):
		return "stale_result"
	case errors.Is(err, ErrMaybeDelivered):
		return "maybe_delivered"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, ErrCallerDeadline):
		return "deadline_exceeded"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &pe):
		return "handler_panic"
	case errors.As(err, &no):
		return "not_owner"
	case errors.As(err, &ud):
		return "undelivered"
	case errors.Is(err, entity.ErrMailboxFull):
		return "mailbox_full"
	case errors.Is(err, entity.ErrUnknownKind):
		return "unknown_kind"
	case errors.Is(err, entity.ErrUnknownMethod):
		return "unknown_method"
	case errors.Is(err, entity.ErrBadRequest):
		return "bad_request"
	}
	return "handler_error"
}
