package transport

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/shardhost/shardhost/internal/hostilepeer"
	"google.golang.org/protobuf/encoding/protowire"
)

// BenchmarkDecodeHostile decodes, with the gRPC codec, messages of about
// 4 MiB (the default MaxMessageSize) built to make each decoder of peer
// input allocate the most, and reports what it allocates per MiB decoded
// (alloc-MiB/MiB); the 512-* messages are a batch of as many frames as a
// decoder takes, the smallest it keeps (tiny: an ID each; request: a
// request with a header entry each). Run it with
//
//	go test -run '^$' -bench DecodeHostile -benchtime 20x ./transport/
func BenchmarkDecodeHostile(b *testing.B) {
	const size = 4 << 20
	req := hostilepeer.Request("k", "m", "e", []byte("x"))
	header := protowire.AppendBytes(protowire.AppendTag(nil, 9, protowire.BytesType), []byte{0x0a, 0x01, 'k'})
	respRepeated := bytes.Repeat([]byte{0x1a, 0x02, 'a', 'b'}, size/4) // a message string repeated
	for _, c := range []struct {
		name  string
		msg   []byte
		fresh func() any
	}{
		{"frameBatch/empty-frames", hostilepeer.EmptyFrames(size), func() any { return new(frameBatch) }},
		{"frameBatch/tiny-frames", hostilepeer.TinyFrames(size / 4), func() any { return new(frameBatch) }},
		{"frameBatch/512-tiny-frames", hostilepeer.TinyFrames(512), func() any { return new(frameBatch) }},
		{"frameBatch/512-request-frames", hostilepeer.RequestBatch(1, 512, header), func() any { return new(frameBatch) }},
		{"frame/repeated-request", hostilepeer.RepeatedRequest(size, req), func() any { return new(frame) }},
		{"DeliverRequest/repeated-strings", hostilepeer.RepeatedStrings(size, req), func() any { return new(DeliverRequest) }},
		{"DeliverRequest/giant-headers", hostilepeer.GiantHeaders(size, req), func() any { return new(DeliverRequest) }},
		{"DeliverResponse/repeated-strings", respRepeated, func() any { return new(DeliverResponse) }},
		{"hotResponse/empty-entities", bytes.Repeat([]byte{0x0a, 0x00}, size/2), func() any { return new(hotResponse) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.msg)))
			data := asReceived(c.msg)
			defer data.Free()
			before := allocatedBytes()
			for b.Loop() {
				_ = wireCodec{}.Unmarshal(data, c.fresh())
			}
			b.ReportMetric(float64(allocatedBytes()-before)/float64(b.N)/float64(len(c.msg)), "alloc-MiB/MiB")
		})
	}
}

// allocatedBytes returns the bytes the heap allocated so far.
func allocatedBytes() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}
