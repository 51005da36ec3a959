package runner

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardhost/shardhost/entity"
)

// Sending from handlers: the sender a handler's context carries, and sends
// that do not hold the caller (a handler's mailbox) while the target fails
// over. What blocks, and for how long, is in the package documentation
// ("Sending from a handler").

// Sender is what a handler sends with: the runner hosting it, as an
// entity.Sender (Send: Ask and Tell wait) and an entity.AsyncSender
// (SendAsync: AskAsync and TellAsync do not).
type Sender interface {
	entity.Sender
	entity.AsyncSender
}

var _ Sender = (*Runner)(nil)

// SenderFrom returns the sender of the handler (or lifecycle hook) whose
// context ctx is, or a context derived from it: the runner hosting it, so
// that entities send to entities without a runner kept in a global.
// Its asynchronous sends (SendAsync: AskAsync, TellAsync) keep ctx's
// trace and baggage — their client spans are children of the handler's
// span — but not its cancellation or deadline (they have their own
// timeout), and they never hold the handler:
//
//	func (r *Room) Post(ctx context.Context, m Msg) (int, error) {
//		s, _ := runner.SenderFrom(ctx)
//		for _, member := range r.members {
//			Deliver.TellAsync(s, member, m, time.Second, nil) // never holds the room; in Post's trace
//		}
//		...
//	}
//
// Take a sender from each handler's own context: one kept from another
// (an Activate hook's, say) sends in that one's trace. Send (Ask, Tell)
// traces with the context it is given, as always.
//
// ok is false for a context that no runner gave a handler.
func SenderFrom(ctx context.Context) (s Sender, ok bool) {
	env, ok := ctx.Value(shardEnvKey{}).(*shardEnv)
	if !ok {
		return nil, false
	}
	sc, bag := trace.SpanContextFromContext(ctx), baggage.FromContext(ctx)
	if !sc.IsValid() && bag.Len() == 0 { // tracing off: nothing to keep
		return env.r, true
	}
	return handlerSender{env.r, sendTrace{sc, bag}}, true
}

// handlerSender is a runner sending for a traced handler (SenderFrom).
type handlerSender struct {
	r  *Runner
	tr sendTrace
}

var _ Sender = handlerSender{}

// Send implements entity.Sender: Runner.Send.
func (h handlerSender) Send(ctx context.Context, c entity.Call) (any, error) { return h.r.Send(ctx, c) }

// SendAsync implements entity.AsyncSender: Runner.SendAsync in the
// handler's trace, with its baggage.
func (h handlerSender) SendAsync(c entity.Call, timeout time.Duration, done func(resp any, err error)) {
	h.r.sendAsync(h.tr, c, timeout, done, h.r.Send)
}

// sendTrace is what an asynchronous send keeps of its sender's context:
// its span (the parent of the send's client span) and baggage.
type sendTrace struct {
	parent trace.SpanContext
	bag    baggage.Baggage
}

// context returns ctx carrying t.
func (t sendTrace) context(ctx context.Context) context.Context {
	if t.parent.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, t.parent)
	}
	if t.bag.Len() > 0 {
		ctx = baggage.ContextWithBaggage(ctx, t.bag)
	}
	return ctx
}

// SendAsync sends c without waiting and reports the outcome to done (see
// entity.AsyncSender; the typed forms are MethodRef.AskAsync and
// SignalRef.TellAsync). A goroutine of the runner sends it like Send —
// routed to the owner, retried while no owner is known or the owner
// fails over — bounded by timeout (Config.RequestTimeout when <= 0) and by
// the runner: when Run ends (Shutdown, Close) sends still in flight are
// cancelled (they fail with ErrClosed or a context error whose cause is
// ErrShutdown) and Run waits for them and their done calls. done runs on that goroutine, or on the caller's
// before SendAsync returns when the send is refused at once: the runner
// has stopped (ErrClosed), or Config.MaxAsyncSends sends are in flight
// (ErrTooManyAsyncSends). Sends made one after another this way are
// independent: they may be delivered in any order. Its client span starts
// a new trace: a handler's sender (SenderFrom) sends in the handler's.
func (r *Runner) SendAsync(c entity.Call, timeout time.Duration, done func(resp any, err error)) {
	r.sendAsync(sendTrace{}, c, timeout, done, r.Send)
}

// sendAsync is SendAsync in the trace tr (none when zero), sending with
// send (Runner.Send, or a Ref's).
func (r *Runner) sendAsync(tr sendTrace, c entity.Call, timeout time.Duration, done func(resp any, err error), send func(context.Context, entity.Call) (any, error)) {
	if timeout <= 0 {
		timeout = r.cfg.RequestTimeout
	}
	if err := r.async.begin(r.cfg.MaxAsyncSends); err != nil {
		if done != nil {
			done(nil, fmt.Errorf("runner %s: %w", r.cfg.ID, err))
		}
		return
	}
	go func() {
		defer r.async.end()
		ctx, cancel := context.WithTimeout(tr.context(r.async.ctx), timeout)
		resp, err := send(ctx, c)
		cancel()
		if done != nil {
			done(resp, err)
		}
	}()
}

// asyncSends tracks SendAsync's goroutines: at most Config.MaxAsyncSends
// at once, all cancelled and waited for when the runner stops.
type asyncSends struct {
	ctx    context.Context // cancelled (ErrShutdown) when the runner stops
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	n       int  // in flight
	stopped bool // no more sends
}

func (a *asyncSends) init() {
	a.ctx, a.cancel = context.WithCancelCause(context.Background())
}

// begin admits one more send, or says why not.
func (a *asyncSends) begin(limit int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.stopped:
		return fmt.Errorf("%w: it has stopped", ErrClosed)
	case a.n >= limit:
		return fmt.Errorf("%w (%d in flight)", ErrTooManyAsyncSends, a.n)
	}
	a.n++
	a.wg.Add(1)
	return nil
}

func (a *asyncSends) end() {
	a.mu.Lock()
	a.n--
	a.mu.Unlock()
	a.wg.Done()
}

// stop refuses new sends, cancels those in flight and waits for them (and
// their done calls). Idempotent.
func (a *asyncSends) stop() {
	a.mu.Lock()
	a.stopped = true
	a.mu.Unlock()
	a.cancel(ErrShutdown)
	a.wg.Wait()
}
