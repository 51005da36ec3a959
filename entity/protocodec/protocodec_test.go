package protocodec_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/entity/protocodec"
)

type ledger struct{ total int64 }

func (l *ledger) Add(_ context.Context, r *wrapperspb.Int64Value) (*wrapperspb.Int64Value, error) {
	l.total += r.GetValue()
	return wrapperspb.Int64(l.total), nil
}

func (l *ledger) Label(_ context.Context, r *structpb.Struct) error { return nil }

var (
	ledgers = entity.NewKind("ledger", func(string) *ledger { return &ledger{} }, entity.WithCodec(protocodec.Codec))
	add     = entity.Method(ledgers, "add", (*ledger).Add)
	label   = entity.Signal(ledgers, "label", (*ledger).Label)
)

// A method's request and response survive the codec as the runtime uses
// it: encoded by Handler.Encode, decoded by the handler's decoders (the
// codec's Decode, a new message each time).
func TestMessagesRoundTripThroughAKindsHandlers(t *testing.T) {
	h, ok := ledgers.Handler(add.Name())
	if !ok {
		t.Fatal("no handler add")
	}
	in := wrapperspb.Int64(-42)
	b, err := h.Encode(protocodec.Codec, in)
	if err != nil {
		t.Fatal(err)
	}
	got, err := h.DecodeRequest(protocodec.Codec, b)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := got.(*wrapperspb.Int64Value)
	if !ok || !proto.Equal(m, in) || m == in {
		t.Fatalf("decoded %#v (%T), want a new message equal to %v", got, got, in)
	}
	// A nil message travels as an empty one and arrives as a new empty
	// message, never as nil.
	b, err = h.Encode(protocodec.Codec, (*wrapperspb.Int64Value)(nil))
	if err != nil || len(b) != 0 {
		t.Fatalf("Encode(nil message) = %x, %v; want no bytes", b, err)
	}
	got, err = h.DecodeResponse(protocodec.Codec, b)
	if m, ok := got.(*wrapperspb.Int64Value); err != nil || !ok || m == nil || m.GetValue() != 0 {
		t.Fatalf("DecodeResponse(no bytes) = %#v, %v; want a new empty message", got, err)
	}
	s, _ := structpb.NewStruct(map[string]any{"name": "west", "tags": []any{"a", 1.5, true, nil}})
	hs, _ := ledgers.Handler(label.Name())
	b, err = hs.Encode(protocodec.Codec, s)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := hs.DecodeRequest(protocodec.Codec, b); err != nil || !proto.Equal(got.(proto.Message), s) {
		t.Fatalf("struct round trip = %v, %v; want %v", got, err, s)
	}
}

// Bytes that are not the type's encoding fail with ErrBadRequest, naming
// the type; a value that is not a message is refused by Marshal.
func TestBadBytesAndValuesAreTypedErrors(t *testing.T) {
	h, _ := ledgers.Handler(add.Name())
	for _, b := range [][]byte{{0xff}, {0x08}, {0x0a, 0x05, 0x01}, []byte("{\"value\":1}")} {
		_, err := h.DecodeRequest(protocodec.Codec, b)
		if !errors.Is(err, entity.ErrBadRequest) || !strings.Contains(err.Error(), "wrapperspb.Int64Value") {
			t.Errorf("DecodeRequest(%x) = %v, want ErrBadRequest naming the type", b, err)
		}
	}
	if _, err := protocodec.Codec.Marshal(struct{ N int }{1}); err == nil || !strings.Contains(err.Error(), "not a protocol buffer message") {
		t.Errorf("Marshal(struct) = %v, want an error saying it is not a message", err)
	}
}

// Types that are not generated message pointers are refused when the
// method is defined.
func TestDefinitionRefusesTypesThatAreNotMessages(t *testing.T) {
	type plain struct{ N int }
	defines := func(f func()) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err, _ = r.(error)
			}
		}()
		f()
		return nil
	}
	k := entity.NewKind("refuser", func(string) *ledger { return &ledger{} }, entity.WithCodec(protocodec.Codec))
	for name, f := range map[string]func(){
		"a struct request": func() {
			entity.Method(k, "p", func(*ledger, context.Context, plain) (*wrapperspb.Int64Value, error) { return nil, nil })
		},
		"an int64 response": func() {
			entity.Method(k, "v", func(*ledger, context.Context, *wrapperspb.Int64Value) (int64, error) { return 0, nil })
		},
		"an interface": func() {
			entity.Method(k, "i", func(*ledger, context.Context, proto.Message) (*wrapperspb.Int64Value, error) { return nil, nil })
		},
	} {
		if err := defines(f); !errors.Is(err, entity.ErrInvalidKind) || !strings.Contains(err.Error(), `codec "proto"`) {
			t.Errorf("%s: Method = %v, want ErrInvalidKind naming the codec", name, err)
		}
	}
}

// Unmarshal, for callers other than the runtime: into a message, or
// through a pointer to a message pointer.
func TestUnmarshalIntoAMessageOrAPointerToOne(t *testing.T) {
	b, _ := protocodec.Codec.Marshal(wrapperspb.String("x"))
	var m wrapperspb.StringValue
	if err := protocodec.Codec.Unmarshal(b, &m); err != nil || m.GetValue() != "x" {
		t.Fatalf("Unmarshal(into a message) = %v, %q", err, m.GetValue())
	}
	var p *wrapperspb.StringValue
	if err := protocodec.Codec.Unmarshal(b, &p); err != nil || p.GetValue() != "x" {
		t.Fatalf("Unmarshal(into a pointer) = %v, %v", err, p)
	}
	var nilMsg *wrapperspb.StringValue
	if err := protocodec.Codec.Unmarshal(b, nilMsg); err == nil {
		t.Fatal("Unmarshal(into a nil message) succeeded")
	}
	var n int
	if err := protocodec.Codec.Unmarshal(b, &n); err == nil {
		t.Fatal("Unmarshal(into *int) succeeded")
	}
}
