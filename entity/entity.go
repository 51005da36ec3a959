package entity

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/shardhost/shardhost/sharding"
)

// Defaults of a kind's options.
const (
	DefaultIdleAfter = 2 * time.Minute
	DefaultMailbox   = 1024
)

// Sentinel errors of the entity API. They survive the wire between runners
// (the transport maps them to codes and back).
var (
	// ErrUnknownKind: no kind of that name is registered on the runner.
	ErrUnknownKind = errors.New("entity: unknown kind")
	// ErrUnknownMethod: the kind has no method of that name.
	ErrUnknownMethod = errors.New("entity: unknown method")
	// ErrMailboxFull: the entity's mailbox is at its bound; the message was
	// not enqueued.
	ErrMailboxFull = errors.New("entity: mailbox full")
	// ErrInvalidKind: a kind or method definition is unusable.
	ErrInvalidKind = errors.New("entity: invalid kind")
	// ErrBadRequest: a request or response could not be decoded.
	ErrBadRequest = errors.New("entity: undecodable message")
)

// PanicError is returned to the asker when its message's handler panicked.
// The entity instance is discarded and recreated on the next message.
type PanicError struct {
	Kind, Method, Entity string
	Value                string // fmt.Sprint of the panic value
	Stack                string // the panicking goroutine's stack (empty after a hop)
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("entity: %s %q: handler %s panicked: %s", e.Kind, e.Entity, e.Method, e.Value)
}

// ActivateReason says why an entity became live on this runner.
type ActivateReason string

// Activation reasons.
const (
	// ActivateNew: first message since the shard was acquired here, or
	// since the entity was passivated.
	ActivateNew ActivateReason = "new"
	// ActivateHandoff: the shard arrived here through a planned handoff.
	ActivateHandoff ActivateReason = "handoff"
	// ActivateRestart: the previous instance panicked.
	ActivateRestart ActivateReason = "restart"
	// ActivateRemembered: a remembered entity (a kind with the Remembered
	// option) started by its shard's owner without a message: after the
	// shard was acquired (a planned move, a takeover after a crash, a
	// cold start), or again after its instance failed.
	ActivateRemembered ActivateReason = "remembered"
)

// WarmInfo is passed to Warmer.Warm.
type WarmInfo struct {
	Entity string
	Shard  sharding.ShardID
	From   string // the runner currently owning the shard
	// Restore reads the entity's last checkpoint (ok false if none), as
	// in ActivateInfo. Nil when the runtime has no store.
	Restore func(ctx context.Context) (data []byte, ok bool, err error)
}

// ActivateInfo is passed to Activator.Activate.
type ActivateInfo struct {
	Entity string
	Shard  sharding.ShardID
	Epoch  int64 // the shard's ownership epoch on this runner
	Reason ActivateReason
	// Restore reads the entity's last checkpoint (ok false if none ever
	// written). Nil when the runtime has no store.
	Restore func(ctx context.Context) (data []byte, ok bool, err error)
	// Checkpoint stores data for the entity, fenced by Epoch, like
	// ReleaseInfo.Checkpoint: keep it to checkpoint periodically from
	// handlers (it fails with the storage's ErrFenced once the shard's
	// ownership moved on). Nil when the runtime has no store.
	Checkpoint func(ctx context.Context, data []byte) error
	// DeleteCheckpoint deletes the entity's checkpoint, fenced by Epoch
	// like Checkpoint, as ReleaseInfo.DeleteCheckpoint. Nil when the
	// runtime has no store.
	DeleteCheckpoint func(ctx context.Context) error
}

// ReleaseInfo is passed to Releaser.Release.
type ReleaseInfo struct {
	Entity string
	Shard  sharding.ShardID
	Epoch  int64 // still valid while Release runs
	// Reason is the runtime's cause: the runner's ErrIdleExpired (no
	// message for IdleAfter) or ErrEvicted (MaxResidentEntities exceeded)
	// — both match ErrPassivated — or ErrShardMoved or ErrShutdown. Only
	// ErrIdleExpired says the entity fell out of use: delete state on it,
	// never on ErrEvicted.
	Reason error
	// Checkpoint stores data for the entity, fenced by Epoch: it fails
	// (with an error matching the storage's ErrFenced) if the shard's
	// ownership moved on. An instance's checkpoints are ordered: one that
	// succeeded is never overwritten by an earlier call, not even by one
	// that failed as unavailable (a timeout) and that the store applies
	// later — that write is refused (each write names the revision it
	// expects, see storage.Checkpoints). Calls of one instance (Activate's
	// and Release's functions included) run one at a time. Nil when the
	// runtime has no store.
	Checkpoint func(ctx context.Context, data []byte) error
	// DeleteCheckpoint deletes the entity's checkpoint, fenced by Epoch
	// like Checkpoint (deleting none is no error). Checkpoints have no
	// expiry: an entity whose state ended (a cart checked out, a session
	// closed) deletes its checkpoint here instead of writing one, or it
	// stays in the store for good. Nil when the runtime has no store.
	DeleteCheckpoint func(ctx context.Context) error
}

// Warmer is implemented by entities that can prepare on a new owner before
// it takes traffic (e.g. load state into a cache). Warm is called by the
// new owner during a planned handoff for the entities the old owner reports
// as hot, while the old owner still serves them: it must be
// non-authoritative (no fenced writes, no side effects others rely on).
// Calls for different entities may run concurrently; Warm may block up to
// the handoff's WarmTimeout (ctx). An error is logged; the move goes on.
type Warmer interface {
	Warm(ctx context.Context, info WarmInfo) error
}

// Activator is implemented by entities that need to load state when they
// become live on this runner. Activate is called on the entity's own
// goroutine before its first message (one at a time with its handlers), so
// it may block; ctx is the shard's context. An error fails the message that
// triggered activation (and discards the instance: the next message tries
// again).
type Activator interface {
	Activate(ctx context.Context, info ActivateInfo) error
}

// Releaser is implemented by entities that must save state when they stop
// being live here: on passivation, when the shard is released or handed
// off, and on graceful shutdown. Release is called after the entity's
// mailbox drained, never concurrently with its handlers, while the shard's
// epoch is still valid: the place to write a fenced checkpoint. It is not
// called when the runner detaches (the epoch can no longer be trusted) or
// crashes. ctx is bounded by the drain timeout. An error is logged.
type Releaser interface {
	Release(ctx context.Context, info ReleaseInfo) error
}

// Options are a kind's settings.
type Options struct {
	IdleAfter time.Duration // passivate after this long without messages
	Mailbox   int           // bound of queued messages per entity
	Codec     Codec         // used only when a message leaves the process
	// TicksAreActivity: timer and reminder deliveries count as activity
	// for idle passivation (by default they do not: a periodic tick does
	// not keep an otherwise idle entity resident).
	TicksAreActivity bool
	// Remembered: an entity of the kind, once activated, is remembered
	// in the store and kept running by its shard's owner, wherever the
	// shard goes, until it calls Forget (see the Remembered option).
	Remembered bool
}

// Option configures a kind.
type Option func(*Options)

// IdleAfter passivates an entity after d without messages. Default 2 min.
func IdleAfter(d time.Duration) Option { return func(o *Options) { o.IdleAfter = d } }

// Mailbox bounds the number of messages queued per entity. Default 1024.
func Mailbox(n int) Option { return func(o *Options) { o.Mailbox = n } }

// WithCodec sets the codec of the kind's messages. Default JSON.
func WithCodec(c Codec) Option { return func(o *Options) { o.Codec = c } }

// TicksAreActivity makes the kind's timer and reminder deliveries count as
// activity for idle passivation, like messages: an entity with a periodic
// timer then stays resident until the timer stops.
func TicksAreActivity() Option { return func(o *Options) { o.TicksAreActivity = true } }

// Remembered makes the kind's entities always on: the first activation of
// an entity (by a message, a tick or a user's call) records it in the
// store (one fenced write per entity, batched; none for an entity already
// remembered, none per message or activation), and from then on its
// shard's owner activates it without a message — right after acquiring
// the shard (a planned move, a takeover after a crash, a cold start), at
// a bounded rate (the runner's RememberedStartRate), and again after its
// instance panicked or its Activate failed (with a growing back-off). A
// remembered entity is never passivated (idle or evicted by the resident
// cap) until it calls Forget: then it is an ordinary entity again. Its
// Activate sees ActivateRemembered when no message started it.
func Remembered() Option { return func(o *Options) { o.Remembered = true } }

// Descriptor is the type-erased view of a kind that runtimes use.
// *Kind[E] implements it.
type Descriptor interface {
	// Name is the kind's name, unique in a cluster.
	Name() string
	// New returns a fresh instance for the entity id.
	New(id string) any
	// Handler returns the method of that name.
	Handler(method string) (*Handler, bool)
	// Options returns the kind's options (defaults applied).
	Options() Options
}

// Handler is one registered method or signal of a kind, type-erased.
type Handler struct {
	kind       string
	name       string
	oneWay     bool
	idempotent bool
	invoke     func(inst any, ctx context.Context, req any) (any, error)
	decReq     func(c Codec, b []byte) (any, error)
	decRsp     func(c Codec, b []byte) (any, error)
	tick       TickKind                           // timer or reminder handler (time.go)
	mkTick     func(c Codec, t Tick) (any, error) // builds a tick handler's request
	// noPayload: the request and response carry nothing (RememberMethod's
	// empty struct): encoded by the kind's codec when it can (JSON's "{}",
	// what runners before noPayload expect), as no bytes otherwise (a
	// protocol buffer codec has no encoding for a Go struct); decoded
	// whatever the bytes.
	noPayload bool
}

// Name returns the method's name.
func (h *Handler) Name() string { return h.name }

// Kind returns the name of the method's kind.
func (h *Handler) Kind() string { return h.kind }

// OneWay reports whether the method is a signal (no response).
func (h *Handler) OneWay() bool { return h.oneWay }

// Idempotent reports whether the method was defined with the Idempotent
// option: the runtime may deliver it more than once.
func (h *Handler) Idempotent() bool { return h.idempotent }

// Invoke calls the method on inst (an instance made by the kind's New).
func (h *Handler) Invoke(inst any, ctx context.Context, req any) (any, error) {
	return h.invoke(inst, ctx, req)
}

// Encode encodes a request or a response of this method with c, the
// kind's codec.
func (h *Handler) Encode(c Codec, v any) ([]byte, error) {
	b, err := c.Marshal(v)
	if err != nil && h.noPayload {
		return nil, nil
	}
	return b, err
}

// DecodeRequest decodes a request of this method.
func (h *Handler) DecodeRequest(c Codec, b []byte) (any, error) { return h.decReq(c, b) }

// DecodeResponse decodes a response of this method (nil for signals).
func (h *Handler) DecodeResponse(c Codec, b []byte) (any, error) { return h.decRsp(c, b) }

// Kind describes an entity type E: how to create instances and which
// methods they have. Define kinds and their methods once, at package level;
// they are safe for concurrent use once defined.
type Kind[E any] struct {
	name     string
	newFn    func(id string) *E
	opts     Options
	handlers map[string]*Handler
}

var _ Descriptor = (*Kind[struct{}])(nil)

// NewKind defines a kind. It panics on an empty name, a nil constructor or
// invalid options: kinds are defined at init time, where a panic is the
// clearest report.
func NewKind[E any](name string, newFn func(id string) *E, opts ...Option) *Kind[E] {
	o := Options{IdleAfter: DefaultIdleAfter, Mailbox: DefaultMailbox, Codec: JSON}
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case name == "":
		panic(fmt.Errorf("%w: empty kind name", ErrInvalidKind))
	case newFn == nil:
		panic(fmt.Errorf("%w: kind %q: nil constructor", ErrInvalidKind, name))
	case o.IdleAfter <= 0:
		panic(fmt.Errorf("%w: kind %q: IdleAfter must be positive", ErrInvalidKind, name))
	case o.Mailbox <= 0:
		panic(fmt.Errorf("%w: kind %q: Mailbox must be positive", ErrInvalidKind, name))
	case o.Codec == nil:
		panic(fmt.Errorf("%w: kind %q: nil codec", ErrInvalidKind, name))
	}
	k := &Kind[E]{name: name, newFn: newFn, opts: o, handlers: make(map[string]*Handler)}
	if o.Remembered {
		k.handlers[RememberMethod] = rememberHandler(name)
	}
	return k
}

// Name implements Descriptor.
func (k *Kind[E]) Name() string { return k.name }

// New implements Descriptor.
func (k *Kind[E]) New(id string) any { return k.newFn(id) }

// Handler implements Descriptor.
func (k *Kind[E]) Handler(method string) (*Handler, bool) {
	h, ok := k.handlers[method]
	return h, ok
}

// Options implements Descriptor.
func (k *Kind[E]) Options() Options { return k.opts }

func (k *Kind[E]) add(h *Handler) {
	if h.name == "" {
		panic(fmt.Errorf("%w: kind %q: empty method name", ErrInvalidKind, k.name))
	}
	if h.name == RememberMethod {
		panic(fmt.Errorf("%w: kind %q: method name %q is reserved (Remember)", ErrInvalidKind, k.name, h.name))
	}
	if _, dup := k.handlers[h.name]; dup {
		panic(fmt.Errorf("%w: kind %q: method %q defined twice", ErrInvalidKind, k.name, h.name))
	}
	k.handlers[h.name] = h
}

// Warms reports whether the kind's instances implement Warmer (a runner
// taking a shard over asks the old owner for its hot entities only if some
// registered kind can warm them).
func (k *Kind[E]) Warms() bool {
	_, ok := any((*E)(nil)).(Warmer)
	return ok
}

// Sender delivers calls to entities: a runner, locally or across the
// cluster. entity never imports the runner; the runner implements Sender.
type Sender interface {
	// Send delivers c and, unless c.Handler is one-way, returns the
	// handler's response.
	Send(ctx context.Context, c Call) (any, error)
}

// AsyncSender is implemented by senders that deliver a call without the
// caller waiting (the runner's SendAsync): SendAsync returns at once and
// reports the outcome to done later, so a handler sending to an entity
// whose runner is failing over does not hold its own mailbox meanwhile.
// The send is bounded by timeout (the sender's default when <= 0). done
// (if not nil) is called once, with the response (nil for a one-way
// handler) and the error, on a goroutine of the sender — or on the
// caller's before SendAsync returns when the send is refused at once —
// so it must not block for long; to act on the outcome in an entity, Tell
// it to the entity.
type AsyncSender interface {
	SendAsync(c Call, timeout time.Duration, done func(resp any, err error))
}

// Call is one message to an entity.
type Call struct {
	Kind    Descriptor
	Handler *Handler
	Entity  string
	Req     any
}

// MethodRef is a request/response method of kind E, created by Method.
type MethodRef[E, Req, Resp any] struct {
	kind *Kind[E]
	h    *Handler
}

// MethodOption configures a method or signal.
type MethodOption func(*methodOptions)

type methodOptions struct {
	idempotent bool
}

// Idempotent declares that running the method more than once for one call
// has the effect of running it once (a read, a put of a value, a command
// carrying its own deduplication key). The sender then retries a call that
// failed with an error meaning "the handler may have run, the result is
// unknown" (the runner's ErrMaybeDelivered, including a withheld stale
// result) until it succeeds or its context ends, instead of returning that
// error. Other errors, handler errors among them, end the retries; once an
// attempt may have run, the error returned still matches ErrMaybeDelivered.
func Idempotent() MethodOption { return func(o *methodOptions) { o.idempotent = true } }

// Method registers fn, usually a method expression such as (*Counter).Inc,
// as the request/response method name of kind k.
//
// Req and Resp must survive the kind's codec (see Codec): Method panics
// with ErrInvalidKind, naming the field, when they do not (an unexported
// field, a channel, ...), since such a call would work while the entity is
// local and arrive zeroed, or fail, once it lives on another runner.
func Method[E, Req, Resp any](k *Kind[E], name string, fn func(*E, context.Context, Req) (Resp, error), opts ...MethodOption) *MethodRef[E, Req, Resp] {
	if fn == nil {
		panic(fmt.Errorf("%w: kind %q: nil method %q", ErrInvalidKind, k.name, name))
	}
	checkTypes[Req](k, name, "request")
	checkTypes[Resp](k, name, "response")
	var o methodOptions
	for _, opt := range opts {
		opt(&o)
	}
	h := &Handler{
		kind: k.name, name: name, idempotent: o.idempotent,
		invoke: func(inst any, ctx context.Context, req any) (any, error) {
			return fn(inst.(*E), ctx, req.(Req))
		},
		decReq: decoder[Req](),
		decRsp: decoder[Resp](),
	}
	k.add(h)
	return &MethodRef[E, Req, Resp]{kind: k, h: h}
}

// checkTypes panics unless T survives k's codec.
func checkTypes[T any, E any](k *Kind[E], method, what string) {
	if err := checkCodec[T](k.opts.Codec); err != nil {
		panic(fmt.Errorf("%w: kind %q: method %q: %s type %s does not survive codec %q: %w",
			ErrInvalidKind, k.name, method, what, reflect.TypeFor[T](), k.opts.Codec.Name(), err))
	}
}

// Name returns the method's name.
func (m *MethodRef[E, Req, Resp]) Name() string { return m.h.name }

// Ask sends req to the entity id and waits for its response. Delivery is
// at most once: if Ask returns an error that does not guarantee the message
// was not delivered (a handler error, a timeout after sending), the handler
// may have run. For a method defined with Idempotent, the sender retries
// after "may have run" errors until ctx ends, so the handler may run more
// than once.
func (m *MethodRef[E, Req, Resp]) Ask(ctx context.Context, s Sender, id string, req Req) (Resp, error) {
	v, err := s.Send(ctx, Call{Kind: m.kind, Handler: m.h, Entity: id, Req: req})
	if err != nil {
		var zero Resp
		return zero, err
	}
	r, ok := v.(Resp)
	if !ok && v != nil {
		var zero Resp
		return zero, fmt.Errorf("%w: %s.%s response is %T", ErrBadRequest, m.kind.name, m.h.name, v)
	}
	return r, nil
}

// AskAsync sends req to the entity id without waiting (see AsyncSender):
// done, if not nil, receives the response or the error once the call is
// answered, fails or times out (timeout <= 0: the sender's default).
// Asks sent one after another this way may run in any order.
func (m *MethodRef[E, Req, Resp]) AskAsync(s AsyncSender, id string, req Req, timeout time.Duration, done func(Resp, error)) {
	s.SendAsync(Call{Kind: m.kind, Handler: m.h, Entity: id, Req: req}, timeout, func(v any, err error) {
		if done == nil {
			return
		}
		r, ok := v.(Resp)
		if err == nil && !ok && v != nil {
			err = fmt.Errorf("%w: %s.%s response is %T", ErrBadRequest, m.kind.name, m.h.name, v)
		}
		done(r, err)
	})
}

// SignalRef is a fire-and-forget method of kind E, created by Signal.
type SignalRef[E, Req any] struct {
	kind *Kind[E]
	h    *Handler
}

// Signal registers fn as the fire-and-forget method name of kind k. Its
// error is logged by the runtime (WARN, rate-limited per kind and signal),
// not returned to the sender. Req must survive the kind's codec, as for
// Method (Signal panics with ErrInvalidKind otherwise). With Idempotent, a
// Tell that failed with the runner's ErrMaybeDelivered is sent again.
func Signal[E, Req any](k *Kind[E], name string, fn func(*E, context.Context, Req) error, opts ...MethodOption) *SignalRef[E, Req] {
	if fn == nil {
		panic(fmt.Errorf("%w: kind %q: nil signal %q", ErrInvalidKind, k.name, name))
	}
	checkTypes[Req](k, name, "request")
	var o methodOptions
	for _, opt := range opts {
		opt(&o)
	}
	h := &Handler{
		kind: k.name, name: name, oneWay: true, idempotent: o.idempotent,
		invoke: func(inst any, ctx context.Context, req any) (any, error) {
			return nil, fn(inst.(*E), ctx, req.(Req))
		},
		decReq: decoder[Req](),
		decRsp: func(Codec, []byte) (any, error) { return nil, nil },
	}
	k.add(h)
	return &SignalRef[E, Req]{kind: k, h: h}
}

// Name returns the signal's name.
func (s *SignalRef[E, Req]) Name() string { return s.h.name }

// Tell enqueues req for the entity id and returns without waiting for the
// handler. A nil error means the message was accepted by the owner's
// mailbox; it may still be dropped if the shard is lost before it runs.
func (s *SignalRef[E, Req]) Tell(ctx context.Context, snd Sender, id string, req Req) error {
	_, err := snd.Send(ctx, Call{Kind: s.kind, Handler: s.h, Entity: id, Req: req})
	return err
}

// TellAsync enqueues req for the entity id without waiting, even for an
// owner (see AsyncSender): done, if not nil, receives nil once the owner's
// mailbox accepted it, or the error (timeout <= 0: the sender's default).
// Signals sent one after another this way may be accepted in any order.
func (s *SignalRef[E, Req]) TellAsync(snd AsyncSender, id string, req Req, timeout time.Duration, done func(error)) {
	snd.SendAsync(Call{Kind: s.kind, Handler: s.h, Entity: id, Req: req}, timeout, func(_ any, err error) {
		if done != nil {
			done(err)
		}
	})
}

func decoder[T any]() func(Codec, []byte) (any, error) {
	return func(c Codec, b []byte) (any, error) {
		var v T
		if d, ok := c.(ValueDecoder); ok {
			x, err := d.Decode(b, v)
			if err != nil {
				return nil, fmt.Errorf("%w: %T: %w", ErrBadRequest, v, err)
			}
			if v, ok = x.(T); !ok {
				return nil, fmt.Errorf("%w: %T: codec %q decoded a %T", ErrBadRequest, v, c.Name(), x)
			}
			return v, nil
		}
		if err := c.Unmarshal(b, &v); err != nil {
			return nil, fmt.Errorf("%w: %T: %w", ErrBadRequest, v, err)
		}
		return v, nil
	}
}
