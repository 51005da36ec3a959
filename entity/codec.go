package entity

import (
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// Codec encodes requests and responses when a message leaves the process.
// Local delivery never encodes. Implementations must be safe for concurrent
// use.
//
// The codec contract: a value of a method's request or response type must
// come out of Unmarshal(Marshal(v)) equal to v, because the same call is
// delivered as a value when the entity is local and encoded when it lives on
// another runner. A type that loses data on the way (an unexported field the
// codec skips, a channel, a function) works in a single process and arrives
// zeroed, or fails, on another runner. Method and Signal therefore check
// their request and response types against the kind's codec when they are
// defined and panic with ErrInvalidKind if a type does not round-trip: with
// a TypeChecker codec (JSON is one) by inspecting the type, with any other
// codec by encoding and decoding a zero value.
type Codec interface {
	Name() string
	Marshal(v any) ([]byte, error)
	Unmarshal(b []byte, v any) error
}

// TypeChecker is implemented by codecs that can tell from a type alone
// whether its values survive Marshal and Unmarshal. Method and Signal call
// CheckType once per request and response type, at definition; the error
// names what does not survive.
type TypeChecker interface {
	CheckType(t reflect.Type) error
}

// ValueDecoder is implemented by codecs whose values are pointers to
// values the codec makes, such as protocol buffer messages
// (entity/protocodec): a request, response or reminder payload of type T
// is decoded by Decode(b, zero), zero being T's zero value (a nil pointer
// of the message type), which returns a new T — the codec allocates it
// itself, with no reflection. Other codecs decode a T with Unmarshal(b,
// &t).
type ValueDecoder interface {
	Decode(b []byte, zero any) (any, error)
}

// JSON is the default codec: encoding/json. Its CheckType rejects, anywhere
// in a type: unexported struct fields (encoding/json skips them; tag a field
// `json:"-"` to state that it stays local and arrives zeroed), channels,
// functions, complex numbers and unsafe pointers (it cannot encode them),
// interfaces other than any (it cannot decode into them), maps whose keys
// are not strings, integers or encoding.TextMarshaler, and embedded pointers
// to unexported struct types. Types implementing json.Marshaler,
// json.Unmarshaler, encoding.TextMarshaler or encoding.TextUnmarshaler are
// trusted. A field of type any round-trips with JSON's types (numbers
// become float64).
var JSON Codec = jsonCodec{}

type jsonCodec struct{}

func (jsonCodec) Name() string                    { return "json" }
func (jsonCodec) Marshal(v any) ([]byte, error)   { return json.Marshal(v) }
func (jsonCodec) Unmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

var _ TypeChecker = jsonCodec{}

// CheckType implements TypeChecker (see JSON).
func (jsonCodec) CheckType(t reflect.Type) error {
	return checkJSON(t, t.String(), map[reflect.Type]bool{})
}

var (
	jsonMarshaler     = reflect.TypeFor[json.Marshaler]()
	jsonUnmarshaler   = reflect.TypeFor[json.Unmarshaler]()
	textMarshaler     = reflect.TypeFor[encoding.TextMarshaler]()
	textUnmarshaler   = reflect.TypeFor[encoding.TextUnmarshaler]()
	emptyInterfaceTyp = reflect.TypeFor[any]()
)

// customJSON reports whether t encodes itself.
func customJSON(t reflect.Type) bool {
	for _, c := range []reflect.Type{t, reflect.PointerTo(t)} {
		if c.Implements(jsonMarshaler) || c.Implements(jsonUnmarshaler) || c.Implements(textMarshaler) || c.Implements(textUnmarshaler) {
			return true
		}
	}
	return false
}

// checkJSON walks t; path names where t sits in the checked type.
func checkJSON(t reflect.Type, path string, seen map[reflect.Type]bool) error {
	if seen[t] {
		return nil
	}
	seen[t] = true
	if customJSON(t) {
		return nil
	}
	switch t.Kind() {
	case reflect.Chan, reflect.Func, reflect.Complex64, reflect.Complex128, reflect.UnsafePointer:
		return fmt.Errorf("%s is a %s, which encoding/json cannot encode", path, t.Kind())
	case reflect.Interface:
		if t != emptyInterfaceTyp {
			return fmt.Errorf("%s is the interface %s, which encoding/json cannot decode into", path, t)
		}
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return checkJSON(t.Elem(), path+"[elem]", seen)
	case reflect.Map:
		k := t.Key()
		switch k.Kind() {
		case reflect.String, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		default:
			if !k.Implements(textMarshaler) {
				return fmt.Errorf("%s is a map with %s keys, which encoding/json cannot encode", path, k)
			}
		}
		return checkJSON(t.Elem(), path+"[value]", seen)
	case reflect.Struct:
		return checkJSONStruct(t, path, seen)
	}
	return nil
}

func checkJSONStruct(t reflect.Type, path string, seen map[reflect.Type]bool) error {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" && !strings.Contains(f.Tag.Get("json"), ",") {
			continue // explicitly left out
		}
		fpath := path + "." + f.Name
		if !f.IsExported() {
			ft := f.Type
			switch {
			case f.Anonymous && ft.Kind() == reflect.Struct:
				// encoding/json promotes the exported fields of an
				// embedded struct of unexported type.
				if err := checkJSONStruct(ft, path, seen); err != nil {
					return err
				}
				continue
			case f.Anonymous && ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct:
				return fmt.Errorf("%s embeds a pointer to the unexported struct type %s, which encoding/json cannot decode into", path, ft.Elem())
			}
			return fmt.Errorf("field %s is unexported: encoding/json skips it, so it would arrive zeroed on another runner (export it, or tag it `json:\"-\"` if it stays local)", fpath)
		}
		if err := checkJSON(f.Type, fpath, seen); err != nil {
			return err
		}
	}
	return nil
}

// checkCodec reports whether values of T survive c.
func checkCodec[T any](c Codec) error {
	t := reflect.TypeFor[T]()
	if tc, ok := c.(TypeChecker); ok {
		return tc.CheckType(t)
	}
	var zero T
	b, err := c.Marshal(zero)
	if err != nil {
		return fmt.Errorf("encoding a zero %s: %w", t, err)
	}
	if err := c.Unmarshal(b, new(T)); err != nil {
		return fmt.Errorf("decoding a zero %s: %w", t, err)
	}
	return nil
}
