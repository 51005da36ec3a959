package transport

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
)

// The fuzz targets of the delivery stream (mux.go): each side of a Stream
// reads a script of frames from its peer, which may be anything. Run one
// for minutes (see README.md, "Fuzzing"):
//
//	go test -run '^$' -fuzz '^FuzzMuxClient$' -fuzztime 2m -parallel 1 ./transport/

// splitScript cuts a fuzz input into the frames a peer sends: a sequence
// of length-prefixed byte strings (protowire.AppendBytes), the rest of the
// input, if it is not one, being the last frame.
func splitScript(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return append(out, b)
		}
		out, b = append(out, v), b[n:]
	}
	return out
}

// joinScript is the script of frames (rpc Stream: a frame per message).
func joinScript(frames ...*frame) []byte {
	var b []byte
	for _, f := range frames {
		b = protowire.AppendBytes(b, f.Marshal())
	}
	return b
}

// joinBatches is the script of batches of frames (rpc Frames: a batch
// per message).
func joinBatches(batches ...[]*frame) []byte {
	var b []byte
	for _, fs := range batches {
		b = protowire.AppendBytes(b, (&frameBatch{Frames: fs}).Marshal())
	}
	return b
}

// oneEach is the batches of one frame each.
func oneEach(frames ...*frame) [][]*frame {
	var out [][]*frame
	for _, f := range frames {
		out = append(out, []*frame{f})
	}
	return out
}

// decodeScript decodes the frames of a script as the peer's codec does,
// up to the first message that does not decode; ok is false if there is
// one. With batches, each message is a frameBatch.
func decodeScript(chunks [][]byte, batches bool) (frames []*frame, ok bool) {
	for _, c := range chunks {
		if batches {
			var b frameBatch
			if err := codecUnmarshal(c, &b); err != nil {
				return frames, false
			}
			frames = append(frames, b.Frames...)
			continue
		}
		f := new(frame)
		if err := codecUnmarshal(c, f); err != nil {
			return frames, false
		}
		frames = append(frames, f)
	}
	return frames, true
}

// scriptClient is a client stream whose server sends a script of frames,
// once the calls sent theirs, then ends the stream (io.EOF). A frame
// that does not decode ends it with the codec's error, as in gRPC.
type scriptClient struct {
	grpc.ClientStream // (Header and Trailer: not used)
	ctx               context.Context
	chunks            [][]byte
	calls             int
	allSent           chan struct{} // closed once calls frames were sent

	mu        sync.Mutex
	sent      map[uint64]string // frame ID -> entity of its request
	closeSend int
}

func (s *scriptClient) Context() context.Context { return s.ctx }

func (s *scriptClient) SendMsg(m any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range m.(*frameBatch).Frames {
		s.sent[f.ID] = f.Req.Entity
		if len(s.sent) == s.calls {
			close(s.allSent)
		}
	}
	return nil
}

func (s *scriptClient) CloseSend() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeSend++
	return nil
}

func (s *scriptClient) RecvMsg(m any) error {
	<-s.allSent
	if len(s.chunks) == 0 {
		return io.EOF
	}
	c := s.chunks[0]
	s.chunks = s.chunks[1:]
	return codecUnmarshal(c, m)
}

// FuzzMuxClient: whatever batches of frames a server sends on a delivery
// stream (rpc Frames), the client does not panic and answers every call once the stream ends,
// without waiting for its context: the call gets the answer of the first
// frame with its ID; a frame with its ID but no answer, or no such frame
// before the stream ends, fails it with ErrMaybeDelivered. The client
// closes its side only after a goaway.
func FuzzMuxClient(f *testing.F) {
	for _, m := range seedResponses {
		f.Add(joinBatches([]*frame{{ID: 1, Resp: m}}), uint8(1))
	}
	f.Add(joinBatches(oneEach(&frame{ID: 2, Resp: seedResponses[0]}, &frame{ID: 1, Resp: seedResponses[1]}, &frame{ID: 3, Resp: seedResponses[2]})...), uint8(3))
	f.Add(joinBatches([]*frame{{ID: 2, Resp: seedResponses[0]}, {ID: 1, Resp: seedResponses[1]}}, []*frame{{ID: 3, Resp: seedResponses[2]}}), uint8(3))
	f.Add(joinBatches(oneEach(&frame{GoAway: true}, &frame{ID: 1, Resp: seedResponses[0]}, &frame{ID: 2, Resp: seedResponses[0]})...), uint8(2))
	f.Add(joinBatches([]*frame{{GoAway: true}, {ID: 1, Resp: seedResponses[0]}}, []*frame{{ID: 2, Resp: seedResponses[0]}}), uint8(2))
	f.Add(joinBatches(oneEach(&frame{ID: 1, Resp: seedResponses[0]}, &frame{ID: 1, Resp: seedResponses[1]}, &frame{ID: 9, Resp: seedResponses[1]})...), uint8(1))
	f.Add(joinBatches([]*frame{{ID: 1}}), uint8(1))                                       // an answer without a response
	f.Add(joinBatches([]*frame{{ID: 1, GoAway: true, Resp: seedResponses[0]}}), uint8(1)) // goaway and an answer
	f.Add(joinBatches([]*frame{{ID: 1, Req: seedRequests[0]}}), uint8(1))                 // a request, not an answer
	f.Add(joinBatches([]*frame{}, []*frame{{ID: 1, Resp: seedResponses[0]}}), uint8(1))   // an empty batch
	f.Add(append(joinBatches([]*frame{{ID: 2, Resp: seedResponses[0]}}), 0xff, 0xff), uint8(2))
	f.Add([]byte{}, uint8(4))
	f.Fuzz(func(t *testing.T, script []byte, calls uint8) {
		n := int(calls%4) + 1
		chunks := splitScript(script)
		frames, _ := decodeScript(chunks, true)
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			cs := &scriptClient{ctx: ctx, chunks: chunks, calls: n, allSent: make(chan struct{}), sent: make(map[uint64]string)}
			ms := newMux(cs, cancel)
			type result struct {
				resp *DeliverResponse
				err  error
				sent bool
			}
			results := make([]result, n)
			var wg sync.WaitGroup
			wg.Go(ms.recvLoop)
			wg.Go(ms.writeLoop)
			for i := range n {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					r := &results[i]
					r.resp, r.err, r.sent = ms.call(ctx, &DeliverRequest{Kind: "k", Method: "m", Entity: strconv.Itoa(i)}, time.Hour)
				})
			}
			wg.Wait()
			ids := make(map[string]uint64)
			for id, e := range cs.sent {
				ids[e] = id
			}
			for i, r := range results {
				id := ids[strconv.Itoa(i)]
				var first *frame
				for _, f := range frames {
					if f.ID == id {
						first = f
						break
					}
				}
				switch {
				case !r.sent:
					t.Errorf("call %d (frame %d): not sent: %v", i, id, r.err)
				case errors.Is(r.err, context.DeadlineExceeded):
					t.Errorf("call %d (frame %d) waited for its context: %v", i, id, r.err)
				case first != nil && first.Resp != nil:
					if r.err != nil || !equalResponse(r.resp, first.Resp) {
						t.Errorf("call %d (frame %d) = %+v, %v; want %+v", i, id, r.resp, r.err, first.Resp)
					}
				case r.resp != nil || !errors.Is(r.err, ErrMaybeDelivered):
					t.Errorf("call %d (frame %d) = %+v, %v; want ErrMaybeDelivered", i, id, r.resp, r.err)
				}
			}
			goaway := false
			for _, f := range frames {
				goaway = goaway || f.GoAway
			}
			if cs.closeSend > 0 && !goaway {
				t.Errorf("the client closed its side (%d times) without a goaway", cs.closeSend)
			}
			if ms.usable() {
				t.Error("the stream is usable after it ended")
			}
		})
	})
}

// scriptServer is a server stream whose client sends a script of frames,
// then closes its side (io.EOF). A frame that does not decode ends it
// with the codec's error, as in gRPC.
type scriptServer struct {
	grpc.ServerStream // (headers and trailers: not used)
	ctx               context.Context
	chunks            [][]byte

	mu       sync.Mutex
	sent     []*frame
	returned bool // serveStream returned: no SendMsg after that
	late     int  // SendMsg calls after it returned
	empty    int  // batches without a frame sent
}

func (s *scriptServer) Context() context.Context { return s.ctx }

func (s *scriptServer) SendMsg(m any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.returned {
		s.late++
	}
	switch m := m.(type) {
	case *frame:
		s.sent = append(s.sent, m)
	case *frameBatch:
		if len(m.Frames) == 0 {
			s.empty++
		}
		s.sent = append(s.sent, m.Frames...)
	}
	return nil
}

func (s *scriptServer) RecvMsg(m any) error {
	if len(s.chunks) == 0 {
		return io.EOF
	}
	c := s.chunks[0]
	s.chunks = s.chunks[1:]
	return codecUnmarshal(c, m)
}

// deadlineHandler echoes a request's payload, says in the answer whether
// its context has a deadline, and counts the written callbacks.
type deadlineHandler struct{ written atomic.Int64 }

func (h *deadlineHandler) Deliver(ctx context.Context, req *DeliverRequest) (*DeliverResponse, func()) {
	resp := &DeliverResponse{Payload: req.Payload}
	if _, ok := ctx.Deadline(); ok {
		resp.Message = "deadline"
	}
	return resp, func() { h.written.Add(1) }
}

func (h *deadlineHandler) Hot(uint32, int) []EntityRef { return nil }

// FuzzMuxServer: whatever frames a client sends on a delivery stream
// (rpc Stream, a frame per message), the server does not panic, delivers
// every frame with a request and answers it once with a frame of the same
// ID (its handler's context has a deadline exactly when the frame has a
// timeout), ignores frames without a request, sends at most one goaway
// (after the transport started stopping), sends nothing once it
// returned, returns an error exactly when a frame did not decode, and
// gives back its connection's budget (bounds.go) whole.
func FuzzMuxServer(f *testing.F) {
	for _, m := range seedFrames {
		f.Add(joinScript(m), false)
	}
	f.Add(joinScript(seedFrames[0], seedFrames[1], &frame{ID: 1, Req: seedRequests[2]}), true)
	f.Add(append(joinScript(seedFrames[0]), 0x0a, 0x01), false)
	f.Add([]byte{}, true)
	f.Fuzz(func(t *testing.T, script []byte, stopping bool) { fuzzServer(t, script, stopping, false) })
}

// FuzzFramesServer: the same as FuzzMuxServer, for rpc Frames (batches of
// frames both ways; no batch sent is empty).
func FuzzFramesServer(f *testing.F) {
	for _, m := range seedFrames {
		f.Add(joinBatches([]*frame{m}), false)
	}
	f.Add(joinBatches(seedFrames), false)
	f.Add(joinBatches([]*frame{seedFrames[0], seedFrames[1]}, []*frame{{ID: 1, Req: seedRequests[2]}}, nil), true)
	f.Add(append(joinBatches([]*frame{seedFrames[0]}), 0x0a, 0x01), false)
	f.Add([]byte{}, true)
	f.Fuzz(func(t *testing.T, script []byte, stopping bool) { fuzzServer(t, script, stopping, true) })
}

// fuzzServer checks FuzzMuxServer's properties for serveStream or, with
// batches, serveFrames.
func fuzzServer(t *testing.T, script []byte, stopping, batches bool) {
	chunks := splitScript(script)
	frames, ok := decodeScript(chunks, batches)
	synctest.Test(t, func(t *testing.T) {
		h := &deadlineHandler{}
		g := &GRPC{h: h, goaway: make(chan struct{})}
		if stopping {
			close(g.goaway)
		}
		ss := &scriptServer{ctx: context.Background(), chunks: chunks}
		budget, key := g.budgets.acquire(ss) // the stream's connection's: kept for the check below
		defer g.budgets.put(key, budget)
		serve := g.serveStream
		if batches {
			serve = g.serveFrames
		}
		err := serve(ss)
		ss.mu.Lock()
		ss.returned = true
		ss.mu.Unlock()
		synctest.Wait() // a goroutine left behind would send now
		if (err == nil) != ok {
			t.Errorf("serveStream = %v; every frame decoded: %v", err, ok)
		}
		want := make(map[uint64]map[string]int) // ID -> answer -> count
		delivered := 0
		for _, f := range frames {
			if f.Req == nil {
				continue
			}
			delivered++
			if want[f.ID] == nil {
				want[f.ID] = make(map[string]int)
			}
			want[f.ID][answerKey(string(f.Req.Payload), f.TimeoutMs > 0)]++
		}
		goaways := 0
		for _, f := range ss.sent {
			switch {
			case f.GoAway && f.ID == 0 && f.Resp == nil && f.Req == nil:
				goaways++
			case f.GoAway || f.Resp == nil || f.Req != nil:
				t.Errorf("server sent %+v", f)
			default:
				k := answerKey(string(f.Resp.Payload), f.Resp.Message == "deadline")
				if want[f.ID][k] == 0 {
					t.Errorf("server sent an unexpected answer %+v (ID %d)", f.Resp, f.ID)
				} else {
					want[f.ID][k]--
				}
			}
		}
		for id, m := range want {
			for k, n := range m {
				if n != 0 {
					t.Errorf("frame %d: %d requests (%s) not answered", id, n, k)
				}
			}
		}
		if goaways > 1 || goaways == 1 && !stopping {
			t.Errorf("server sent %d goaways (stopping: %v)", goaways, stopping)
		}
		if ss.empty > 0 {
			t.Errorf("server sent %d empty batches", ss.empty)
		}
		if ss.late > 0 {
			t.Errorf("server sent %d frames after serveStream returned", ss.late)
		}
		if n := h.written.Load(); n != int64(delivered) {
			t.Errorf("written called %d times for %d deliveries", n, delivered)
		}
		if n, bytes, workers := budget.n.Load(), budget.bytes.Load(), budget.workers.Load(); n != 0 || bytes != 0 || workers != 0 {
			t.Errorf("after the stream ended its connection's budget holds %d requests, %d bytes, %d workers", n, bytes, workers)
		}
	})
}

func answerKey(payload string, deadline bool) string {
	return strconv.Quote(payload) + " deadline=" + strconv.FormatBool(deadline)
}
