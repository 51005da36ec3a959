package entity_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
)

type acc struct{ n int }

type addReq struct{ N int }

func (a *acc) Add(_ context.Context, r addReq) (int, error) { a.n += r.N; return a.n, nil }
func (a *acc) Set(_ context.Context, r addReq) error        { a.n = r.N; return nil }

// direct is a Sender that runs calls inline on one instance per ID.
type direct struct{ inst map[string]any }

func (d *direct) Send(ctx context.Context, c entity.Call) (any, error) {
	if d.inst[c.Entity] == nil {
		d.inst[c.Entity] = c.Kind.New(c.Entity)
	}
	return c.Handler.Invoke(d.inst[c.Entity], ctx, c.Req)
}

func TestMethodAndSignal(t *testing.T) {
	k := entity.NewKind("acc", func(string) *acc { return &acc{} })
	add := entity.Method(k, "add", (*acc).Add)
	set := entity.Signal(k, "set", (*acc).Set)
	d := &direct{inst: map[string]any{}}
	ctx := context.Background()
	if err := set.Tell(ctx, d, "x", addReq{N: 10}); err != nil {
		t.Fatal(err)
	}
	if n, err := add.Ask(ctx, d, "x", addReq{N: 5}); err != nil || n != 15 {
		t.Fatalf("Ask = %d, %v; want 15", n, err)
	}
	h, ok := k.Handler("add")
	if !ok || h.Name() != "add" || h.Kind() != "acc" || h.OneWay() {
		t.Fatalf("Handler(add) = %+v, %v", h, ok)
	}
	if h, _ := k.Handler("set"); !h.OneWay() {
		t.Fatal("set is not one-way")
	}
	if _, ok := k.Handler("nope"); ok {
		t.Fatal("Handler(nope) found")
	}
}

func TestCodecRoundTrip(t *testing.T) {
	k := entity.NewKind("acc", func(string) *acc { return &acc{} })
	entity.Method(k, "add", (*acc).Add)
	h, _ := k.Handler("add")
	b, err := entity.JSON.Marshal(addReq{N: 3})
	if err != nil {
		t.Fatal(err)
	}
	req, err := h.DecodeRequest(entity.JSON, b)
	if err != nil || req.(addReq).N != 3 {
		t.Fatalf("DecodeRequest = %#v, %v", req, err)
	}
	if _, err := h.DecodeRequest(entity.JSON, []byte("{oops")); !errors.Is(err, entity.ErrBadRequest) {
		t.Fatalf("DecodeRequest(garbage) = %v, want ErrBadRequest", err)
	}
	rsp, err := h.DecodeResponse(entity.JSON, []byte("7"))
	if err != nil || rsp.(int) != 7 {
		t.Fatalf("DecodeResponse = %#v, %v", rsp, err)
	}
}

func TestInvalidDefinitionsPanic(t *testing.T) {
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			p := recover()
			err, ok := p.(error)
			if !ok || !errors.Is(err, entity.ErrInvalidKind) {
				t.Errorf("%s: panic %v, want ErrInvalidKind", name, p)
			}
		}()
		f()
	}
	mustPanic("empty name", func() { entity.NewKind("", func(string) *acc { return nil }) })
	mustPanic("nil constructor", func() { entity.NewKind[acc]("k", nil) })
	mustPanic("zero mailbox", func() { entity.NewKind("k", func(string) *acc { return nil }, entity.Mailbox(0)) })
	mustPanic("negative idle", func() { entity.NewKind("k", func(string) *acc { return nil }, entity.IdleAfter(-time.Second)) })
	k := entity.NewKind("k", func(string) *acc { return nil })
	entity.Method(k, "add", (*acc).Add)
	mustPanic("duplicate method", func() { entity.Method(k, "add", (*acc).Add) })
	mustPanic("nil method", func() { entity.Method[acc, addReq, int](k, "x", nil) })
	if o := k.Options(); o.IdleAfter != entity.DefaultIdleAfter || o.Mailbox != entity.DefaultMailbox || o.Codec.Name() != "json" {
		t.Errorf("defaults = %+v", o)
	}
}

func TestAskWrongResponseType(t *testing.T) {
	k := entity.NewKind("acc", func(string) *acc { return &acc{} })
	add := entity.Method(k, "add", (*acc).Add)
	_, err := add.Ask(context.Background(), stringSender{}, "x", addReq{})
	if !errors.Is(err, entity.ErrBadRequest) {
		t.Fatalf("Ask with a mistyped response = %v, want ErrBadRequest", err)
	}
}

type stringSender struct{}

func (stringSender) Send(context.Context, entity.Call) (any, error) { return "not an int", nil }
