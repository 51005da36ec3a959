// Package protocodec is an [entity.Codec] for protocol buffer messages:
// a kind whose requests, responses and reminder payloads are generated
// message types (pointers, such as *pb.Order) travels between runners in
// the protocol buffer binary format instead of JSON.
//
//	var Orders = entity.NewKind("order", newOrder, entity.WithCodec(protocodec.Codec))
//	var Place = entity.Method(Orders, "place", (*order).Place) // func(ctx, *pb.PlaceReq) (*pb.PlaceResp, error)
//
// Choose it for kinds whose messages are already protocol buffers, or
// whose payloads are large or hot: a message is smaller and encodes and
// decodes with fewer allocations and no reflection over its Go type
// (BENCHMARKS.md, "Entities, remote"). Keep JSON (the default) for plain Go structs:
// it needs no generated code.
//
// A call to an entity of the same runner passes the message itself, not
// a copy (local delivery never encodes): do not change a message after
// sending it — a signal's handler may run after Tell returned — and treat
// the messages a handler receives as read-only.
//
// What it accepts: Method, Signal and Reminder check at definition that
// each request, response and payload type is a pointer to a generated
// message (it implements proto.Message and knows its message type with a
// nil receiver); anything else panics with entity.ErrInvalidKind, naming
// the type. A nil message is sent as an empty one and arrives as a new
// empty message, never as nil. Bytes that are not a valid encoding of the
// type fail the call with entity.ErrBadRequest (the receiver answers
// nothing else); unknown fields are kept, so runners of two versions of a
// message type talk to each other, as protocol buffers promise.
package protocodec

import (
	"fmt"
	"reflect"

	"google.golang.org/protobuf/proto"

	"github.com/shardhost/shardhost/entity"
)

// Codec encodes protocol buffer messages: entity.WithCodec(protocodec.Codec).
var Codec entity.Codec = codec{}

// Name is the codec's name on the wire: a runner refuses a message whose
// kind uses another codec there.
const Name = "proto"

type codec struct{}

var (
	_ entity.ValueDecoder = codec{}
	_ entity.TypeChecker  = codec{}
)

func (codec) Name() string { return Name }

// Marshal encodes v, a proto.Message (a nil one as an empty message).
func (codec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("protocodec: %T is not a protocol buffer message", v)
	}
	return proto.Marshal(m)
}

// Decode implements entity.ValueDecoder: zero is a nil pointer of a
// generated message type; Decode returns a new message of that type
// decoded from b.
func (codec) Decode(b []byte, zero any) (any, error) {
	m, ok := zero.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("protocodec: %T is not a protocol buffer message", zero)
	}
	out := m.ProtoReflect().Type().New().Interface()
	if err := proto.Unmarshal(b, out); err != nil {
		return nil, fmt.Errorf("protocodec: %w", err)
	}
	return out, nil
}

// Unmarshal decodes b into v: a message (a non-nil pointer to it), or a
// pointer to a message pointer, which is set to a new message. The entity
// runtime decodes with Decode; Unmarshal is there for other callers.
func (c codec) Unmarshal(b []byte, v any) error {
	if m, ok := v.(proto.Message); ok {
		if !m.ProtoReflect().IsValid() {
			return fmt.Errorf("protocodec: cannot decode into a nil %T", v)
		}
		if err := proto.Unmarshal(b, m); err != nil {
			return fmt.Errorf("protocodec: %w", err)
		}
		return nil
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || checkType(rv.Type().Elem()) != nil {
		return fmt.Errorf("protocodec: cannot decode into %T: want a protocol buffer message or a pointer to one", v)
	}
	x, err := c.Decode(b, rv.Elem().Interface())
	if err != nil {
		return err
	}
	rv.Elem().Set(reflect.ValueOf(x))
	return nil
}

var messageType = reflect.TypeFor[proto.Message]()

// CheckType implements entity.TypeChecker: t must be a pointer to a
// generated message type.
func (codec) CheckType(t reflect.Type) error { return checkType(t) }

func checkType(t reflect.Type) (err error) {
	if t.Kind() != reflect.Pointer || !t.Implements(messageType) {
		return fmt.Errorf("%s is not a pointer to a protocol buffer message type (codec %q)", t, Name)
	}
	// A generated type answers ProtoReflect with a nil receiver; a
	// hand-written one may not.
	defer func() {
		if recover() != nil {
			err = fmt.Errorf("%s does not describe its message type with a nil receiver (codec %q): use a generated message type", t, Name)
		}
	}()
	mt := reflect.Zero(t).Interface().(proto.Message).ProtoReflect().Type()
	if mt == nil || mt.New() == nil {
		return fmt.Errorf("%s has no message type (codec %q)", t, Name)
	}
	return nil
}
