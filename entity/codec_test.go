package entity_test

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
)

type cart struct{ items map[string]int }

// The newcomer's mistake: an unexported field works locally and arrives
// zeroed on another runner.
type addItemReq struct {
	SKU string
	qty int
}

type (
	withChan      struct{ Done chan struct{} }
	withFunc      struct{ F func() }
	withComplex   struct{ C complex128 }
	withStringer  struct{ S fmt.Stringer }
	nestedHidden  struct{ Lines []addItemReq }
	structKeyMap  struct{ M map[struct{ A int }]int }
	hiddenPointer struct{ *hiddenInner }
	hiddenInner   struct{ A int }
	hiddenValue   struct {
		hiddenInner // promoted: encoding/json encodes A
		B           int
	}
	localOnly struct {
		SKU   string
		trace string          `json:"-"` // stated: stays local
		Until <-chan struct{} `json:"-"`
	}
	recursive struct {
		Name     string
		Children []*recursive
	}
	rich struct {
		At    time.Time // has unexported fields, but marshals itself
		Any   any
		ByInt map[int]string
		Raw   []byte
		Ptr   *int
	}
)

func handler[Req any](t *testing.T, k *entity.Kind[cart], name string) (err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			e, ok := p.(error)
			if !ok {
				t.Fatalf("Method(%s) panicked with %v, want an error", name, p)
			}
			err = e
		}
	}()
	entity.Method(k, name, func(*cart, context.Context, Req) (int, error) { return 0, nil })
	return nil
}

// TestMethodRejectsTypesThatDoNotSurviveTheCodec: a request or response
// type that would lose data between runners panics at definition, naming
// the field, instead of arriving zeroed on another runner.
func TestMethodRejectsTypesThatDoNotSurviveTheCodec(t *testing.T) {
	k := entity.NewKind("cart", func(string) *cart { return &cart{} })
	bad := []struct {
		name, want string
		define     func() error
	}{
		{"unexported", "field entity_test.addItemReq.qty is unexported", func() error { return handler[addItemReq](t, k, "unexported") }},
		{"chan", "Done is a chan", func() error { return handler[withChan](t, k, "chan") }},
		{"func", "F is a func", func() error { return handler[withFunc](t, k, "func") }},
		{"complex", "C is a complex128", func() error { return handler[withComplex](t, k, "complex") }},
		{"interface", "S is the interface fmt.Stringer", func() error { return handler[withStringer](t, k, "interface") }},
		{"nested", "Lines[elem].qty is unexported", func() error { return handler[nestedHidden](t, k, "nested") }},
		{"map key", "map with struct", func() error { return handler[structKeyMap](t, k, "map key") }},
		{"embedded pointer", "embeds a pointer to the unexported struct type", func() error { return handler[hiddenPointer](t, k, "embedded pointer") }},
		{"pointer request", "qty is unexported", func() error { return handler[*addItemReq](t, k, "pointer request") }},
	}
	for _, tc := range bad {
		err := tc.define()
		if !errors.Is(err, entity.ErrInvalidKind) || !strings.Contains(err.Error(), tc.want) ||
			!strings.Contains(err.Error(), `method "`+tc.name+`"`) || !strings.Contains(err.Error(), `codec "json"`) {
			t.Errorf("Method(%s) = %v, want ErrInvalidKind naming the method, the codec and %q", tc.name, err, tc.want)
		}
	}
	good := []struct {
		name   string
		define func() error
	}{
		{"tagged local fields", func() error { return handler[localOnly](t, k, "local") }},
		{"promoted fields", func() error { return handler[hiddenValue](t, k, "promoted") }},
		{"recursive", func() error { return handler[recursive](t, k, "recursive") }},
		{"self-marshalling, any, int keys", func() error { return handler[rich](t, k, "rich") }},
		{"scalar", func() error { return handler[string](t, k, "scalar") }},
	}
	for _, tc := range good {
		if err := tc.define(); err != nil {
			t.Errorf("Method(%s) = %v, want it defined", tc.name, err)
		}
	}
}

// TestResponseAndSignalTypesAreChecked: the check covers responses and
// signals too.
func TestResponseAndSignalTypesAreChecked(t *testing.T) {
	k := entity.NewKind("cart", func(string) *cart { return &cart{} })
	check := func(what string, define func()) {
		t.Helper()
		defer func() {
			err, _ := recover().(error)
			if !errors.Is(err, entity.ErrInvalidKind) || !strings.Contains(err.Error(), "qty is unexported") {
				t.Errorf("%s: panic %v, want ErrInvalidKind naming qty", what, err)
			}
		}()
		define()
	}
	check("response", func() {
		entity.Method(k, "get", func(*cart, context.Context, string) (addItemReq, error) { return addItemReq{}, nil })
	})
	check("signal", func() {
		entity.Signal(k, "add", func(*cart, context.Context, addItemReq) error { return nil })
	})
}

// gobCodec is a codec without a type check: Method round-trips a zero
// value through it instead.
type gobCodec struct{}

func (gobCodec) Name() string { return "gob" }
func (gobCodec) Marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	err := gob.NewEncoder(&b).Encode(v)
	return b.Bytes(), err
}
func (gobCodec) Unmarshal(b []byte, v any) error { return gob.NewDecoder(bytes.NewReader(b)).Decode(v) }

// TestMethodRoundTripsAZeroValueThroughOtherCodecs: codecs that cannot
// inspect types get a zero-value round trip at definition.
func TestMethodRoundTripsAZeroValueThroughOtherCodecs(t *testing.T) {
	k := entity.NewKind("cart", func(string) *cart { return &cart{} }, entity.WithCodec(gobCodec{}))
	if err := handler[addItemReq](t, k, "fine"); err != nil { // gob encodes the exported SKU
		t.Errorf("Method(gob, addItemReq) = %v, want it defined", err)
	}
	type opaque struct{ n int }
	err := handler[opaque](t, k, "opaque")
	if !errors.Is(err, entity.ErrInvalidKind) || !strings.Contains(err.Error(), `codec "gob"`) {
		t.Errorf("Method(gob, struct without exported fields) = %v, want ErrInvalidKind from the round trip", err)
	}
}
