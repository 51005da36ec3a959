package transport

import (
	"bytes"
	"errors"
	"maps"
	"math"
	"runtime"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// The fuzz targets of the wire messages (transport.proto). Each checks, for
// arbitrary bytes b:
//   - decoding never panics, and the message's Unmarshal and the gRPC codec
//     agree;
//   - an error matches ErrMalformed;
//   - a decoded message re-encodes to its canonical form, which decodes to
//     the same message and re-encodes to the same bytes (unknown fields
//     dropped, the last of a repeated scalar kept, varints minimal, a bool
//     as 1, an empty bytes field like an absent one);
//
// and, for a message x built from the other arguments, that
// decode(encode(x)) == x (an empty payload comes back nil).
//
// and that decoding b allocates at most allocPerByte bytes per byte of b,
// plus allocPerMessage (checkAllocBound).
//
// Run one for minutes (see README.md, "Fuzzing"):
//
//	go test -run '^$' -fuzz '^FuzzFrame$' -fuzztime 2m -parallel 1 ./transport/

// wireMessage is a message of transport.proto.
type wireMessage interface {
	Marshal() []byte
	Unmarshal([]byte) error
}

// asReceived returns b as gRPC hands a message of its size to the codec:
// in one buffer of its own up to 1 KiB, in a pooled one above (which the
// codec must not alias: free it once decoded).
func asReceived(b []byte) mem.BufferSlice {
	if mem.IsBelowBufferPoolingThreshold(len(b)) {
		return mem.BufferSlice{mem.SliceBuffer(b)}
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(len(b))
	copy(*buf, b)
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}
}

// codecUnmarshal decodes b into v as the gRPC codec does a message
// received, then frees the buffer: what v aliases must stay intact.
func codecUnmarshal(b []byte, v any) error {
	data := asReceived(b)
	defer func() {
		data.Free()
	}()
	return wireCodec{}.Unmarshal(data, v)
}

// codecMarshal encodes v as the gRPC codec does.
func codecMarshal(v any) ([]byte, error) {
	data, err := wireCodec{}.Marshal(v)
	if err != nil {
		return nil, err
	}
	defer data.Free()
	return data.Materialize(), nil
}

// checkDecode decodes b into a new message (made by fresh) with the
// message's Unmarshal and with the gRPC codec, and checks the properties
// above; it returns the decoded message, or nil when b is malformed.
func checkDecode[M wireMessage](t *testing.T, b []byte, fresh func() M, equal func(a, b M) bool) (M, bool) {
	t.Helper()
	m, viaCodec := fresh(), fresh()
	err := m.Unmarshal(b)
	cerr := codecUnmarshal(b, viaCodec)
	if (err == nil) != (cerr == nil) || err == nil && !equal(m, viaCodec) {
		t.Fatalf("Unmarshal(%x) = %+v, %v; the codec gives %+v, %v", b, m, err, viaCodec, cerr)
	}
	if err != nil {
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("Unmarshal(%x) = %v, want ErrMalformed", b, err)
		}
		return m, false
	}
	enc := m.Marshal()
	if cenc, err := codecMarshal(m); err != nil || !bytes.Equal(cenc, enc) {
		t.Fatalf("codec Marshal(%+v) = %x, %v; want %x", m, cenc, err, enc)
	}
	m2 := fresh()
	if err := m2.Unmarshal(enc); err != nil || !equal(m2, m) {
		t.Fatalf("Unmarshal(Marshal(%+v)) = %+v, %v (from %x)", m, m2, err, b)
	}
	if enc2 := m2.Marshal(); !bytes.Equal(enc2, enc) {
		t.Fatalf("canonical encoding of %+v is not stable: %x, then %x", m, enc, enc2)
	}
	return m, true
}

// The allocation bound of every decoder of peer input: decoding b
// allocates at most allocPerByte bytes per byte of b, plus
// allocPerMessage. The worst inputs are batches of the smallest frames
// that carry something (4 bytes on the wire: 256 bytes of room and a
// pointer each; with a header entry, 9 bytes and a map of one group):
// ≈ 66 bytes per byte. The constant covers a message's own struct and
// one header map. doc.go, "Bounds", states it.
const (
	allocPerByte    = 72
	allocPerMessage = 1 << 10
)

// allocTries is how many times at most a decoding is measured (the least
// measure counts).
const allocTries = 5

// leastAllocated returns the least number of bytes the heap allocated
// while f ran, over at most allocTries runs: it stops at the first run
// that allocated at most bound. The runtime counts the allocations of
// the whole process, and a goroutine running alongside f — another
// test's, or one left behind by one — would be counted as f's: f runs
// with GOMAXPROCS 1 (as in testing.AllocsPerRun), so that another
// goroutine runs meanwhile only if f is preempted (a decoding lasts far
// less than the scheduler's 10 ms slice) or parked (a decoder waits for
// nothing, but a GC assist may park it); f allocates the same at every
// run, so the least measure is f's own once one run went undisturbed.
func leastAllocated(f func(), bound uint64) uint64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	least := uint64(math.MaxUint64)
	var before, after runtime.MemStats
	for range allocTries {
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		if least = min(least, after.TotalAlloc-before.TotalAlloc); least <= bound {
			break
		}
	}
	return least
}

// checkAllocBound decodes b into a message made by fresh, with its
// Unmarshal and as the gRPC codec does (a copy of b when gRPC hands it
// over in a pooled buffer), and fails if either allocated more than the
// bound (measured by leastAllocated).
func checkAllocBound[M wireMessage](t *testing.T, b []byte, fresh func() M) {
	t.Helper()
	bound := uint64(allocPerByte*len(b) + allocPerMessage)
	data := asReceived(b)
	defer data.Free()
	for _, decode := range []func(){
		func() { _ = fresh().Unmarshal(b) },
		func() { _ = wireCodec{}.Unmarshal(data, fresh()) },
	} {
		if got := leastAllocated(decode, bound); got > bound {
			t.Fatalf("decoding %d bytes into %T allocated %d bytes; bound %d (%d per byte + %d)", len(b), fresh(), got, bound, allocPerByte, allocPerMessage)
		}
	}
}

// allocSink keeps what TestAllocMeasureIgnoresOtherGoroutines allocates
// on the heap.
var allocSink []byte

// TestAllocMeasureIgnoresOtherGoroutines: what another goroutine
// allocates while a decoding is measured is not counted as the
// decoding's (the bound of checkAllocBound stays a property of the
// decoder, whatever else the process runs).
func TestAllocMeasureIgnoresOtherGoroutines(t *testing.T) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				allocSink = make([]byte, 64<<10)
			}
		}
	})
	defer func() {
		close(stop)
		wg.Wait()
	}()
	b := seedFrames[0].Marshal()
	bound := uint64(allocPerByte*len(b) + allocPerMessage)
	for range 200 {
		if got := leastAllocated(func() { _ = new(frame).Unmarshal(b) }, bound); got > bound {
			t.Fatalf("decoding %d bytes into a frame measured %d bytes allocated while another goroutine allocates; bound %d", len(b), got, bound)
		}
	}
}

// checkRoundTrip checks decode(encode(x)) == x.
func checkRoundTrip[M wireMessage](t *testing.T, x M, fresh func() M, equal func(a, b M) bool) {
	t.Helper()
	got := fresh()
	if err := got.Unmarshal(x.Marshal()); err != nil || !equal(got, x) {
		t.Fatalf("Unmarshal(Marshal(%+v)) = %+v, %v", x, got, err)
	}
}

func equalRequest(a, b *DeliverRequest) bool {
	if a == nil || b == nil {
		return a == b
	}
	return bytes.Equal(a.Payload, b.Payload) && a.Kind == b.Kind && a.Method == b.Method && a.Entity == b.Entity &&
		a.OneWay == b.OneWay && a.Shard == b.Shard && a.Sender == b.Sender && a.Codec == b.Codec &&
		a.LocksSeen == b.LocksSeen && a.RunnersSeen == b.RunnersSeen &&
		maps.Equal(a.Headers, b.Headers) // nil and empty alike
}

func equalResponse(a, b *DeliverResponse) bool {
	if a == nil || b == nil {
		return a == b
	}
	return bytes.Equal(a.Payload, b.Payload) && a.Code == b.Code && a.Message == b.Message &&
		a.OwnerHint == b.OwnerHint && a.Shard == b.Shard && a.Cause == b.Cause && a.Epoch == b.Epoch
}

func equalFrame(a, b *frame) bool {
	return a.ID == b.ID && a.TimeoutMs == b.TimeoutMs && a.GoAway == b.GoAway &&
		equalRequest(a.Req, b.Req) && equalResponse(a.Resp, b.Resp)
}

func equalHotRequest(a, b *hotRequest) bool { return *a == *b }

func equalHotResponse(a, b *hotResponse) bool {
	if len(a.Entities) != len(b.Entities) {
		return false
	}
	for i := range a.Entities {
		if a.Entities[i] != b.Entities[i] {
			return false
		}
	}
	return true
}

// Real messages, as runners send them: every kind of request, an answer
// with every code, every frame (request, answer, goaway), Hot's request and
// answer.
var (
	seedRequests = []*DeliverRequest{
		{Kind: "counter", Method: "Add", Entity: "user/42", Payload: []byte(`{"n":1}`), Shard: 17, Sender: "runner-1", Codec: "json"},
		{Kind: "counter", Method: "Reset", Entity: "user/42", OneWay: true, Shard: 17, Sender: "runner-1", Codec: "json"},
		{Kind: "k", Method: "m", Entity: "", Shard: 0},
		{Kind: "k", Method: "m", Entity: "e", Payload: make([]byte, 300), Shard: 1<<32 - 1},
		// A traced ask: W3C trace context and baggage in its headers.
		{Kind: "counter", Method: "Add", Entity: "user/42", Payload: []byte(`{"n":1}`), Shard: 17, Sender: "gw", Codec: "json",
			Headers: map[string]string{
				"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
				"tracestate":  "congo=t61rcWkgMzE", "baggage": "tenant=acme",
			}},
		{Kind: "k", Method: "m", OneWay: true, Headers: map[string]string{"": ""}}, // an empty entry
		// An ask sent to the shard's assignee, with the sender's view revisions.
		{Kind: "counter", Method: "Add", Entity: "user/42", Payload: []byte(`{"n":1}`), Shard: 17, Sender: "gw", Codec: "json",
			LocksSeen: 1 << 33, RunnersSeen: 812},
	}
	seedResponses = []*DeliverResponse{
		{Payload: []byte(`{"total":3}`), Epoch: 1234},
		{Code: CodeNotOwner, Message: "shard 17 not owned by runner-2", OwnerHint: "runner-3", Shard: 17},
		{Code: CodeUndelivered, Shard: 17, Cause: CauseDetached},
		{Code: CodeUndelivered, Shard: 17, Cause: CauseShardMoved},
		{Code: CodeUndelivered, Shard: 17, Cause: CauseShutdown},
		{Code: CodeMailboxFull, Message: "mailbox of user/42 is full"},
		{Code: CodeUnknownKind, Message: `kind "x" not registered on runner-2`},
		{Code: CodeUnknownMethod, Message: "counter.Nope"},
		{Code: CodeTooLarge, Message: "request of 5000000 bytes (limit 4194304 on runner-2)"},
		{Code: CodeBadRequest, Message: "entity: bad request"},
		{Code: CodeHandlerError, Message: "out of stock", Epoch: 99},
		{Code: CodeHandlerPanic, Message: "runtime error: index out of range", Epoch: 99},
		{Code: CodeStaleResult, Message: "lease ended", Shard: 3, Cause: CauseShardMoved, Epoch: 1 << 40},
		{Code: -1}, // an unknown code (a sign-extended varint)
	}
	seedFrames = []*frame{
		{ID: 1, Req: seedRequests[0], TimeoutMs: 1500},
		{ID: 2, Req: seedRequests[1]},
		{ID: 1, Resp: seedResponses[0]},
		{ID: 1 << 40, Resp: seedResponses[1]},
		{GoAway: true},
		{ID: 3, Req: &DeliverRequest{}},   // an empty request
		{ID: 3, Resp: &DeliverResponse{}}, // an empty answer (OK, no payload)
		{ID: 4, Req: seedRequests[4], TimeoutMs: 250},
	}
	seedHotRequests  = []*hotRequest{{Shard: 17, Limit: 256}, {Shard: 0, Limit: 1<<32 - 1}}
	seedHotResponses = []*hotResponse{
		{Entities: []EntityRef{{Kind: "counter", ID: "user/42"}, {Kind: "counter", ID: "user/7"}}},
		{Entities: []EntityRef{{}}},
		{},
	}
)

// seedMalformed are byte strings that are no message, or that carry what
// the decoders skip: truncated tags and lengths, field number 0, a varint
// overflow, the deprecated groups (matched and not), a fixed64 and a
// fixed32 field, an unknown field, a field of the wrong wire type.
var seedMalformed = [][]byte{
	{0xff, 0xff},
	{0x0a, 0x05, 'a'},
	{0x00, 0x01},
	{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	{0x0b, 0x08, 0x01, 0x0c},
	{0x0b, 0x08, 0x01, 0x14},
	{0x0c},
	{0x09, 1, 2, 3, 4, 5, 6, 7, 8, 0x0d, 1, 2, 3, 4},
	protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 5),
	protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 5),
	protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "\xff not utf-8"),
	// Header entries: truncated, a key repeated (the last value kept),
	// an entry with an unknown field, a header of the wrong wire type.
	{0x4a, 0x03, 0x0a, 0x05, 'k'},
	{0x4a, 0x06, 0x0a, 0x01, 'k', 0x12, 0x01, 'a', 0x4a, 0x06, 0x0a, 0x01, 'k', 0x12, 0x01, 'b'},
	{0x4a, 0x05, 0x0a, 0x01, 'k', 0x18, 0x07},
	{0x48, 0x01},
	// Headers over the bounds a request keeps: a value too large, dropped,
	// then an entry kept.
	protowire.AppendBytes(protowire.AppendTag(protowire.AppendBytes(protowire.AppendTag(nil, 9, protowire.BytesType),
		protowire.AppendString(protowire.AppendTag([]byte{0x0a, 0x01, 'b'}, 2, protowire.BytesType), string(make([]byte, maxHeaderBytes)))),
		9, protowire.BytesType), []byte{0x0a, 0x01, 'k', 0x12, 0x01, 'v'}),
}

// seedHostile are the shapes of message a peer can build to make a
// decoder allocate the most for the bytes it sends: the most frames a
// batch may hold, each the smallest that carries something, with a
// header entry each; one frame more than that; a message of empty frames;
// fields repeated (a string, a request in a frame, a header entry); the
// most entities of a Hot answer and one more. Each is a valid message of
// one type and decoded as every other type too.
var seedHostile = [][]byte{
	repeatBytes([]byte{0x0a, 0x02, 0x08, 0x01}, maxRecvBatchFrames),
	repeatBytes([]byte{0x0a, 0x02, 0x08, 0x01}, maxRecvBatchFrames+1),
	repeatBytes([]byte{0x0a, 0x07, 0x12, 0x05, 0x4a, 0x03, 0x0a, 0x01, 'k'}, maxRecvBatchFrames),
	repeatBytes([]byte{0x0a, 0x04, 0x12, 0x00, 0x1a, 0x00}, maxRecvBatchFrames),
	repeatBytes([]byte{0x0a, 0x00}, 32<<10),
	repeatBytes([]byte{0x0a, 0x02, 'a', 'b'}, 16<<10),
	repeatBytes([]byte{0x12, 0x00}, 16<<10),
	repeatBytes([]byte{0x4a, 0x03, 0x0a, 0x01, 'k'}, 8<<10),
	repeatBytes([]byte{0x0a, 0x00}, maxHotEntities),
	repeatBytes([]byte{0x0a, 0x00}, maxHotEntities+1),
}

func repeatBytes(b []byte, n int) []byte { return bytes.Repeat(b, n) }

// withinHeaderBounds returns h without its empty key, or nil when a
// decoded request would not keep all of it (maxHeaders, maxHeaderBytes): the round trip of headers
// within the bounds is checked, the dropping of the others by checkDecode
// and TestRequestHeadersDecodedWithinBounds.
func withinHeaderBounds(h map[string]string) map[string]string {
	delete(h, "") // dropped at decode
	n := 0
	for k, v := range h {
		n += len(k) + len(v)
	}
	if len(h) > maxHeaders || n > maxHeaderBytes {
		return nil
	}
	return h
}

// FuzzDeliverRequest fuzzes DeliverRequest.Unmarshal.
func FuzzDeliverRequest(f *testing.F) {
	for _, m := range seedRequests {
		f.Add(m.Marshal(), m.Kind, m.Method, m.Entity, m.Payload, m.OneWay, m.Shard, m.Sender, m.Codec, m.Headers["traceparent"], m.Headers["baggage"],
			m.LocksSeen, m.RunnersSeen)
	}
	for _, b := range slices.Concat(seedMalformed, seedHostile) {
		f.Add(b, "k", "m", "\xff", []byte{}, false, uint32(0), "", "json", "", "\xff", uint64(0), uint64(1))
	}
	fresh := func() *DeliverRequest { return new(DeliverRequest) }
	f.Fuzz(func(t *testing.T, b []byte, kind, method, entity string, payload []byte, oneWay bool, shard uint32, sender, codec, parent, bag string, locksSeen, runnersSeen uint64) {
		checkDecode(t, b, fresh, equalRequest)
		checkAllocBound(t, b, fresh)
		x := &DeliverRequest{Kind: kind, Method: method, Entity: entity, Payload: payload, OneWay: oneWay, Shard: shard, Sender: sender, Codec: codec,
			LocksSeen: locksSeen, RunnersSeen: runnersSeen}
		if parent != "" || bag != "" {
			x.Headers = withinHeaderBounds(map[string]string{"traceparent": parent, "baggage": bag, bag: parent})
		}
		checkRoundTrip(t, x, fresh, equalRequest)
	})
}

// FuzzDeliverResponse fuzzes DeliverResponse.Unmarshal.
func FuzzDeliverResponse(f *testing.F) {
	for _, m := range seedResponses {
		f.Add(m.Marshal(), m.Payload, int32(m.Code), m.Message, m.OwnerHint, m.Shard, int32(m.Cause), m.Epoch)
	}
	for _, b := range slices.Concat(seedMalformed, seedHostile) {
		f.Add(b, []byte(nil), int32(99), "", "", uint32(0), int32(-7), uint64(0))
	}
	fresh := func() *DeliverResponse { return new(DeliverResponse) }
	f.Fuzz(func(t *testing.T, b []byte, payload []byte, code int32, message, hint string, shard uint32, cause int32, epoch uint64) {
		checkDecode(t, b, fresh, equalResponse)
		checkAllocBound(t, b, fresh)
		x := &DeliverResponse{Payload: payload, Code: Code(code), Message: message, OwnerHint: hint, Shard: shard, Cause: Cause(cause), Epoch: epoch}
		checkRoundTrip(t, x, fresh, equalResponse)
	})
}

// FuzzFrame fuzzes frame.Unmarshal (the messages of the delivery
// stream), including the request and answer inside a frame.
func FuzzFrame(f *testing.F) {
	for _, m := range seedFrames {
		var parent string
		if m.Req != nil {
			parent = m.Req.Headers["traceparent"]
		}
		f.Add(m.Marshal(), m.ID, m.Req != nil, m.Resp != nil, "e", []byte("p"), int32(CodeOK), m.TimeoutMs, m.GoAway, parent)
	}
	for _, b := range slices.Concat(seedMalformed, seedHostile) {
		f.Add(b, uint64(0), true, true, "", []byte(nil), int32(-1), uint32(0), true, "")
	}
	// A frame whose request or answer is itself malformed.
	f.Add([]byte{0x08, 0x01, 0x12, 0x02, 0xff, 0xff}, uint64(1), true, false, "", []byte(nil), int32(0), uint32(0), false, "")
	f.Add([]byte{0x08, 0x01, 0x1a, 0x01, 0x08}, uint64(1), false, true, "", []byte(nil), int32(0), uint32(0), false, "")
	// A frame whose request's header entry is malformed.
	f.Add([]byte{0x08, 0x01, 0x12, 0x04, 0x4a, 0x02, 0x0a, 0x05}, uint64(1), true, false, "", []byte(nil), int32(0), uint32(0), false, "x")
	fresh := func() *frame { return new(frame) }
	f.Fuzz(func(t *testing.T, b []byte, id uint64, hasReq, hasResp bool, entity string, payload []byte, code int32, timeoutMs uint32, goAway bool, parent string) {
		checkDecode(t, b, fresh, equalFrame)
		checkAllocBound(t, b, fresh)
		x := &frame{ID: id, TimeoutMs: timeoutMs, GoAway: goAway}
		if hasReq {
			x.Req = &DeliverRequest{Kind: "k", Method: "m", Entity: entity, Payload: payload, Shard: uint32(id)}
			if parent != "" {
				x.Req.Headers = withinHeaderBounds(map[string]string{"traceparent": parent})
			}
		}
		if hasResp {
			x.Resp = &DeliverResponse{Payload: payload, Code: Code(code), Message: entity, Epoch: id}
		}
		checkRoundTrip(t, x, fresh, equalFrame)
	})
}

// FuzzFrameBatch fuzzes frameBatch.Unmarshal (rpc Frames' message); the
// round trip is of a batch of n frames built from the other arguments.
func FuzzFrameBatch(f *testing.F) {
	f.Add((&frameBatch{Frames: seedFrames}).Marshal(), uint8(3), "e", []byte("p"))
	for _, m := range seedFrames {
		f.Add((&frameBatch{Frames: []*frame{m}}).Marshal(), uint8(1), "", []byte(nil))
	}
	for _, b := range slices.Concat(seedMalformed, seedHostile) {
		f.Add(b, uint8(0), "", []byte(nil))
	}
	// A batch with a malformed frame after a good one; an empty frame.
	f.Add(append((&frameBatch{Frames: seedFrames[:1]}).Marshal(), 0x0a, 0x02, 0x08, 0xff), uint8(2), "", []byte(nil))
	f.Add([]byte{0x0a, 0x00}, uint8(1), "", []byte(nil))
	fresh := func() *frameBatch { return new(frameBatch) }
	equal := func(a, b *frameBatch) bool {
		return slices.EqualFunc(a.Frames, b.Frames, equalFrame)
	}
	f.Fuzz(func(t *testing.T, b []byte, n uint8, entity string, payload []byte) {
		checkDecode(t, b, fresh, equal)
		checkAllocBound(t, b, fresh)
		x := &frameBatch{}
		for i := range int(n % 8) {
			fr := &frame{ID: uint64(i) + 1}
			if i%2 == 0 {
				fr.Req = &DeliverRequest{Kind: "k", Entity: entity, Payload: payload, Shard: uint32(i)}
			} else {
				fr.Resp = &DeliverResponse{Payload: payload, Message: entity}
			}
			x.Frames = append(x.Frames, fr)
		}
		checkRoundTrip(t, x, fresh, equal)
	})
}

// FuzzHotRequest fuzzes hotRequest.Unmarshal.
func FuzzHotRequest(f *testing.F) {
	for _, m := range seedHotRequests {
		f.Add(m.Marshal(), m.Shard, m.Limit)
	}
	for _, b := range slices.Concat(seedMalformed, seedHostile) {
		f.Add(b, uint32(1), uint32(0))
	}
	fresh := func() *hotRequest { return new(hotRequest) }
	f.Fuzz(func(t *testing.T, b []byte, shard, limit uint32) {
		checkDecode(t, b, fresh, equalHotRequest)
		checkAllocBound(t, b, fresh)
		checkRoundTrip(t, &hotRequest{Shard: shard, Limit: limit}, fresh, equalHotRequest)
	})
}

// FuzzHotResponse fuzzes hotResponse.Unmarshal.
func FuzzHotResponse(f *testing.F) {
	for _, m := range seedHotResponses {
		f.Add(m.Marshal(), uint8(len(m.Entities)), "counter", "user/42")
	}
	for _, b := range slices.Concat(seedMalformed, seedHostile) {
		f.Add(b, uint8(1), "", "")
	}
	// An entity that is itself malformed.
	f.Add([]byte{0x0a, 0x02, 0x0a, 0x05}, uint8(0), "", "")
	fresh := func() *hotResponse { return new(hotResponse) }
	f.Fuzz(func(t *testing.T, b []byte, n uint8, kind, id string) {
		checkDecode(t, b, fresh, equalHotResponse)
		checkAllocBound(t, b, fresh)
		x := &hotResponse{}
		for i := range int(n) {
			// Every other entity empty: an empty entity is still one.
			if i%2 == 0 {
				x.Entities = append(x.Entities, EntityRef{Kind: kind, ID: id[:i%(len(id)+1)]})
			} else {
				x.Entities = append(x.Entities, EntityRef{})
			}
		}
		checkRoundTrip(t, x, fresh, equalHotResponse)
	})
}
