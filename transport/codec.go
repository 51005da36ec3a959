package transport

import (
	"fmt"

	"google.golang.org/grpc/mem"
)

// wireCodec is the gRPC codec of the runner service (encoding.CodecV2).
//
// It encodes into buffers of gRPC's pool, which gRPC gives back once it
// wrote them (a message costs the allocation of its one-buffer list), and
// decodes a message of at most 1 KiB (an ask's request or answer, most
// often) into strings and payloads that alias the bytes received (see
// received): they cost no allocation. Larger ones are decoded into
// copies.
type wireCodec struct{}

func (wireCodec) Name() string { return "shardhost-v1" }

func (wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *frameBatch:
		return pooled(m)
	case *DeliverRequest:
		return pooled(m)
	case *DeliverResponse:
		return pooled(m)
	case *frame:
		return pooled(m)
	case *hotRequest:
		return mem.BufferSlice{mem.SliceBuffer(m.Marshal())}, nil
	case *hotResponse:
		return mem.BufferSlice{mem.SliceBuffer(m.Marshal())}, nil
	default:
		return nil, fmt.Errorf("%w: cannot marshal %T", ErrMalformed, v)
	}
}

func (wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	b, alias := received(data)
	switch m := v.(type) {
	case *frameBatch:
		return m.decode(b, alias)
	case *DeliverRequest:
		return m.unmarshal(b, &DeliverRequest{}, alias)
	case *DeliverResponse:
		return m.unmarshal(b, alias)
	case *frame:
		return m.unmarshal(b, &DeliverRequest{}, nil, alias)
	case *hotRequest:
		return m.Unmarshal(b)
	case *hotResponse:
		return m.Unmarshal(b)
	default:
		return fmt.Errorf("%w: cannot unmarshal into %T", ErrMalformed, v)
	}
}

// minPooled is the least capacity of an encoding buffer: gRPC returns
// smaller ones to no pool (mem.IsBelowBufferPoolingThreshold), and wraps
// them in an allocation of their own.
const minPooled = 1<<10 + 1

// pooled encodes m into a buffer of gRPC's default pool (size is an upper
// bound of its encoding: appending never grows the buffer).
func pooled[M interface {
	size() int
	appendTo([]byte) []byte
}](m M) (mem.BufferSlice, error) {
	pool := mem.DefaultBufferPool()
	buf := pool.Get(max(m.size(), minPooled))
	*buf = m.appendTo((*buf)[:0])
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// received returns the bytes of a message gRPC received and whether a
// message decoded from them may alias them (see wireCodec): only those of
// a lone mem.SliceBuffer of at most 1 KiB — gRPC allocated it for one
// HTTP/2 data frame below its pooling threshold and never reuses it (its
// Free does nothing), so a decoded string or payload keeps at most that
// KiB alive. A pooled buffer goes back to its pool once Unmarshal
// returns; and one copy of a larger message would be kept whole by any
// string of any frame it carries — a request held by a handler, or an
// answer not written yet, would keep up to MaxMessageSize alive while
// the connection's budget counts its own bytes: those are decoded into
// copies of their fields, from the buffer itself when it is one.
func received(data mem.BufferSlice) ([]byte, bool) {
	if len(data) == 1 {
		if b, ok := data[0].(mem.SliceBuffer); ok && mem.IsBelowBufferPoolingThreshold(cap(b)) {
			return b, true
		}
		return data[0].ReadOnlyData(), false
	}
	return data.Materialize(), false
}
