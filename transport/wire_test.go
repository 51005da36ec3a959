package transport

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

func TestWireRoundTrip(t *testing.T) {
	req := &DeliverRequest{Kind: "k", Method: "m", Entity: "e/1", Payload: []byte{0, 1, 2}, OneWay: true, Shard: 77, Sender: "s", Codec: "json",
		LocksSeen: 1 << 40, RunnersSeen: 7}
	var got DeliverRequest
	if err := got.Unmarshal(req.Marshal()); err != nil || got.Kind != "k" || got.Entity != "e/1" || !got.OneWay || got.Shard != 77 || string(got.Payload) != "\x00\x01\x02" || got.Codec != "json" || got.Sender != "s" ||
		got.LocksSeen != 1<<40 || got.RunnersSeen != 7 {
		t.Fatalf("request round trip = %+v, %v", got, err)
	}
	resp := &DeliverResponse{Payload: []byte("p"), Code: CodeNotOwner, Message: "m", OwnerHint: "h", Shard: 3, Cause: CauseShutdown, Epoch: 1 << 33}
	var gr DeliverResponse
	if err := gr.Unmarshal(resp.Marshal()); err != nil || gr.Code != CodeNotOwner || gr.OwnerHint != "h" || gr.Cause != CauseShutdown || string(gr.Payload) != "p" || gr.Epoch != 1<<33 {
		t.Fatalf("response round trip = %+v, %v", gr, err)
	}
	f := &frame{ID: 1 << 40, Req: req, Resp: resp, TimeoutMs: 1500, GoAway: true}
	var gf frame
	if err := gf.Unmarshal(f.Marshal()); err != nil || gf.ID != 1<<40 || gf.TimeoutMs != 1500 || !gf.GoAway ||
		gf.Req == nil || gf.Req.Entity != "e/1" || gf.Resp == nil || gf.Resp.OwnerHint != "h" {
		t.Fatalf("frame round trip = %+v, %v", gf, err)
	}
	hot := &hotResponse{Entities: []EntityRef{{Kind: "k", ID: "a"}, {Kind: "k2", ID: "b"}}}
	var gh hotResponse
	if err := gh.Unmarshal(hot.Marshal()); err != nil || len(gh.Entities) != 2 || gh.Entities[1].ID != "b" {
		t.Fatalf("hot round trip = %+v, %v", gh, err)
	}
	if err := gr.Unmarshal([]byte{0xff, 0xff}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("unmarshal(garbage) = %v, want ErrMalformed", err)
	}
}

// TestRequestHeadersOnTheWire: a request's headers travel as a protobuf
// map (one entry message per pair, in key order, so that the encoding is
// canonical), and a request without any is encoded as before the field
// existed: not one byte more.
func TestRequestHeadersOnTheWire(t *testing.T) {
	plain := &DeliverRequest{Kind: "k", Method: "m", Entity: "e", Payload: []byte("p"), Shard: 3, Sender: "s", Codec: "json"}
	traced := *plain
	traced.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "baggage": "a=1", "tracestate": "x=y"}
	enc := traced.Marshal()
	if !bytes.HasPrefix(enc, plain.Marshal()) {
		t.Fatalf("a traced request's encoding %x does not extend the plain one %x", enc, plain.Marshal())
	}
	want := plain.Marshal()
	for _, k := range []string{"baggage", "traceparent", "tracestate"} { // key order
		entry := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), k)
		entry = protowire.AppendString(protowire.AppendTag(entry, 2, protowire.BytesType), traced.Headers[k])
		want = protowire.AppendBytes(protowire.AppendTag(want, 9, protowire.BytesType), entry)
	}
	for range 20 { // map iteration order varies; the encoding does not
		if got := traced.Marshal(); !bytes.Equal(got, want) {
			t.Fatalf("Marshal(%+v) = %x, want %x", traced, got, want)
		}
	}
	var got DeliverRequest
	if err := got.Unmarshal(enc); err != nil || !maps.Equal(got.Headers, traced.Headers) {
		t.Fatalf("Unmarshal: headers %v, %v; want %v", got.Headers, err, traced.Headers)
	}
	if err := got.Unmarshal(plain.Marshal()); err != nil || got.Headers != nil {
		t.Fatalf("Unmarshal(plain): headers %v (%v), want nil: no allocation when nothing is propagated", got.Headers, err)
	}
}

// TestRequestHeadersDecodedWithinBounds: a peer's request whose headers
// field holds hundreds of thousands of entries (within the transport's
// message limit) decodes to at most maxHeaders entries of at most
// maxHeaderBytes, without allocating in proportion to the entries sent;
// an entry too large for what is left (a huge baggage) is dropped while a
// trace context after it is kept.
func TestRequestHeadersDecodedWithinBounds(t *testing.T) {
	entry := func(b []byte, k, v string) []byte {
		e := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), k)
		e = protowire.AppendString(protowire.AppendTag(e, 2, protowire.BytesType), v)
		return protowire.AppendBytes(protowire.AppendTag(b, 9, protowire.BytesType), e)
	}
	b := (&DeliverRequest{Kind: "k", Method: "m", Entity: "e"}).Marshal()
	b = entry(b, "baggage", strings.Repeat("x", 2*maxHeaderBytes))
	parent := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	b = entry(b, "traceparent", parent)
	n := 0
	for ; len(b) < 4<<20; n++ {
		b = entry(b, fmt.Sprintf("k%07d", n), "")
	}
	var m DeliverRequest
	var err error
	allocs := math.Inf(1)
	for range 3 { // the least: another goroutine may allocate meanwhile
		allocs = min(allocs, testing.AllocsPerRun(1, func() { err = m.Unmarshal(b) }))
	}
	if err != nil {
		t.Fatal(err)
	}
	if m.Headers["traceparent"] != parent {
		t.Errorf("traceparent = %q, want %q kept (the oversized baggage before it dropped)", m.Headers["traceparent"], parent)
	}
	if _, ok := m.Headers["baggage"]; ok {
		t.Errorf("a baggage of %d bytes was kept, over the %d bytes of headers a request keeps", 2*maxHeaderBytes, maxHeaderBytes)
	}
	size := 0
	for k, v := range m.Headers {
		size += len(k) + len(v)
	}
	if len(m.Headers) > maxHeaders || size > maxHeaderBytes {
		t.Errorf("%d entries sent (%d bytes): %d kept, %d bytes; want at most %d, %d bytes", n+2, len(b), len(m.Headers), size, maxHeaders, maxHeaderBytes)
	}
	if allocs > 4*maxHeaders {
		t.Errorf("decoding %d header entries made %v allocations, want at most %d", n+2, allocs, 4*maxHeaders)
	}
}

// A message the codec decoded outlives the buffer gRPC received it in: a
// pooled buffer (over 1 KiB) goes back to its pool and is written over
// once Unmarshal returns, and the strings and payloads decoded from it
// stay intact; a request decoded from a delivery stream answers into
// room of its own, once.
func TestDecodedBatchOutlivesPooledBuffer(t *testing.T) {
	payload := bytes.Repeat([]byte("p"), 2<<10)
	in := &frameBatch{Frames: []*frame{
		{ID: 1, Req: &DeliverRequest{Kind: "kind", Method: "m", Entity: "e/1", Payload: payload, Sender: "s", Codec: "json"}},
		{ID: 2, Resp: &DeliverResponse{Payload: []byte("answer"), Epoch: 9}},
	}}
	enc := in.Marshal()
	for _, pooled := range []bool{false, true} {
		var data mem.BufferSlice
		if pooled {
			buf := mem.DefaultBufferPool().Get(len(enc))
			copy(*buf, enc)
			data = mem.BufferSlice{mem.NewBuffer(buf, mem.DefaultBufferPool())}
		} else {
			data = mem.BufferSlice{mem.SliceBuffer(slices.Clone(enc))}
		}
		raw := slices.Clone(data[0].ReadOnlyData()) // as data says, before it is freed
		var got frameBatch
		if err := (wireCodec{}).Unmarshal(data, &got); err != nil {
			t.Fatal(err)
		}
		if !pooled && !bytes.Equal(raw, enc) {
			t.Fatalf("received %x, want %x", raw, enc)
		}
		if pooled {
			buf := data[0].ReadOnlyData()
			data.Free()
			clear(buf[:cap(buf)]) // what the next user of the pooled buffer may do
		}
		if len(got.Frames) != 2 || !equalFrame(got.Frames[0], in.Frames[0]) || !equalFrame(got.Frames[1], in.Frames[1]) {
			t.Fatalf("pooled %v: decoded %+v, want %+v", pooled, got.Frames, in.Frames)
		}
		req := got.Frames[0].Req
		resp := req.NewResponse()
		if resp == nil || !equalResponse(resp, &DeliverResponse{}) || req.NewResponse() == resp {
			t.Fatalf("NewResponse = %p %+v, then another? want room once", resp, resp)
		}
	}
	if r := (&DeliverRequest{}).NewResponse(); r == nil {
		t.Fatal("NewResponse of a request without room = nil")
	}
}

// A message over 1 KiB is decoded into copies of its fields, whether
// gRPC hands it over in one pooled buffer or in several: a string of one
// frame does not keep the whole message (another frame's large payload)
// alive. One of at most 1 KiB is aliased: it keeps at most that KiB.
func TestLargeMessageDecodedIntoCopies(t *testing.T) {
	payload := bytes.Repeat([]byte("p"), 2<<10)
	in := &frameBatch{Frames: []*frame{
		{ID: 1, Req: &DeliverRequest{Kind: "kind", Method: "m", Entity: "e/1", Payload: payload}},
		{ID: 2, Req: &DeliverRequest{Kind: "kind", Method: "m", Entity: "e/2", Payload: []byte("small")}},
	}}
	enc := in.Marshal()
	// within reports whether s starts inside the allocation of b (its
	// bytes, or a little past them: the next frame's).
	within := func(s string, b []byte) bool {
		at, base := uintptr(unsafe.Pointer(unsafe.StringData(s))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		return at >= base && at < base+uintptr(len(b))+256
	}
	half := len(enc) / 2
	for name, data := range map[string]mem.BufferSlice{
		"one pooled buffer": asReceived(enc),
		"two buffers":       {mem.SliceBuffer(slices.Clone(enc[:half])), mem.SliceBuffer(slices.Clone(enc[half:]))},
		"one large slice":   {mem.SliceBuffer(slices.Clone(enc))},
	} {
		var got frameBatch
		if err := (wireCodec{}).Unmarshal(data, &got); err != nil {
			t.Fatal(err)
		}
		data.Free()
		if len(got.Frames) != 2 || !equalFrame(got.Frames[0], in.Frames[0]) || !equalFrame(got.Frames[1], in.Frames[1]) {
			t.Fatalf("%s: decoded %+v, want %+v", name, got.Frames, in.Frames)
		}
		if within(got.Frames[1].Req.Entity, got.Frames[0].Req.Payload) {
			t.Errorf("%s: the second frame's entity shares the memory of the first frame's payload", name)
		}
	}
	small := (&DeliverRequest{Kind: "kind", Method: "m", Entity: "e/3", Payload: []byte("small")}).Marshal()
	b := slices.Clone(small)
	var got DeliverRequest
	if err := (wireCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Entity != "e/3" || !within(got.Entity, b) {
		t.Errorf("a message of %d bytes in a buffer of its own: entity %q copied, want it aliased", len(small), got.Entity)
	}
}
