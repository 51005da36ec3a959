package entity_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/shardhost/shardhost/entity"
)

// fuzzReq is a request of the kinds of fields messages carry.
type fuzzReq struct {
	N    int
	U    uint16
	F    float64
	S    string
	B    []byte
	L    []string
	M    map[string]int
	P    *addReq
	Any  any
	Flag bool `json:"flag,omitempty"`
}

// FuzzDecodeRequest: a runner decodes the payload of every delivery it
// receives (Handler.DecodeRequest) and of every answer (DecodeResponse)
// with the kind's codec. Decoding never panics; an error matches
// ErrBadRequest; a decoded value encodes and decodes to itself (the codec
// contract; JSON's canonical form: member names as the struct spells them,
// the last of duplicate members, invalid UTF-8 replaced by U+FFFD).
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"N":-3,"U":7,"F":1.5,"S":"hi","B":"aGk=","L":["a"],"M":{"x":1},"P":{"N":2},"Any":[1,"a",null,{"b":true}],"flag":true}`,
		`{}`, `null`, `{"N":1e3}`, `{"U":70000}`, `{"n":1,"N":2}`, `{"S":"\ud800"}`, `{"B":"!"}`, `[1]`, `{oops`, ``, `{"F":1e400}`,
	} {
		f.Add([]byte(s))
	}
	k := entity.NewKind("fuzz", func(string) *acc { return new(acc) })
	m := entity.Method(k, "Do", func(*acc, context.Context, fuzzReq) (fuzzReq, error) { return fuzzReq{}, nil })
	h, ok := k.Handler(m.Name())
	if !ok {
		f.Fatal("no handler")
	}
	c := k.Options().Codec
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, dec := range []func(entity.Codec, []byte) (any, error){h.DecodeRequest, h.DecodeResponse} {
			v, err := dec(c, b)
			if err != nil {
				if !errors.Is(err, entity.ErrBadRequest) {
					t.Fatalf("decode(%q) = %v, want ErrBadRequest", b, err)
				}
				continue
			}
			enc, err := c.Marshal(v)
			if err != nil {
				t.Fatalf("Marshal(decoded %+v) = %v", v, err)
			}
			v2, err := dec(c, enc)
			if err != nil || !reflect.DeepEqual(v2, v) {
				t.Fatalf("round trip of %+v (from %q) = %+v, %v", v, b, v2, err)
			}
		}
	})
}
