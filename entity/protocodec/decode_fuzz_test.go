package protocodec_test

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/entity/protocodec"
)

// FuzzDecode: whatever bytes a peer sends, decoding into a message type
// (a flat one, a recursive one, a large generated one) returns a new
// message or an error, never panics; a message decoded encodes again and
// decodes to an equal message (unknown fields kept).
func FuzzDecode(f *testing.F) {
	for _, m := range []proto.Message{
		wrapperspb.Int64(-1), wrapperspb.String("héllo"),
		&descriptorpb.FileDescriptorProto{Name: proto.String("a.proto"), MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("M")}}},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	s, _ := structpb.NewStruct(map[string]any{"k": []any{1.0, "v", map[string]any{"n": nil}}})
	b, _ := proto.Marshal(s)
	f.Add(b)
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}) // a length past the end
	zeros := []proto.Message{(*wrapperspb.Int64Value)(nil), (*wrapperspb.StringValue)(nil), (*structpb.Struct)(nil), (*descriptorpb.FileDescriptorProto)(nil)}
	d := protocodec.Codec.(entity.ValueDecoder)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, zero := range zeros {
			x, err := d.Decode(b, zero)
			if err != nil {
				if x != nil {
					t.Fatalf("Decode(%T) = %v and error %v", zero, x, err)
				}
				continue
			}
			m := x.(proto.Message)
			again, err := protocodec.Codec.Marshal(m)
			if err != nil {
				t.Fatalf("Marshal(decoded %T): %v", zero, err)
			}
			y, err := d.Decode(again, zero)
			if err != nil {
				t.Fatalf("%T: decode(encode(decode(b))): %v", zero, err)
			}
			// (A message holding a NaN is unequal to itself.)
			if !proto.Equal(m, y.(proto.Message)) && proto.Equal(m, m) {
				t.Fatalf("%T: decode(encode(decode(b))) = %v, want %v", zero, y, m)
			}
		}
	})
}
