package transport

import (
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
)

// heldClient is a client stream whose SendMsg waits while held, records
// the frames of each batch, and whose server answers every frame sent
// once its batch is released.
type heldClient struct {
	grpc.ClientStream
	ctx  context.Context
	hold chan struct{} // SendMsg waits for a value (or for close)

	mu      sync.Mutex
	batches [][]string // entities of each batch sent
	answers []*frame
	arrived chan struct{} // a value per answer queued
	ended   chan struct{}
}

func newHeldClient(ctx context.Context) *heldClient {
	return &heldClient{ctx: ctx, hold: make(chan struct{}), arrived: make(chan struct{}, 64), ended: make(chan struct{})}
}

func (s *heldClient) Context() context.Context { return s.ctx }

func (s *heldClient) SendMsg(m any) error {
	<-s.hold
	var ents []string
	s.mu.Lock()
	for _, f := range m.(*frameBatch).Frames {
		ents = append(ents, f.Req.Entity)
		s.answers = append(s.answers, &frame{ID: f.ID, Resp: &DeliverResponse{Payload: []byte(f.Req.Entity)}})
	}
	s.batches = append(s.batches, ents)
	s.mu.Unlock()
	s.arrived <- struct{}{}
	return nil
}

func (s *heldClient) RecvMsg(m any) error {
	select {
	case <-s.arrived:
	case <-s.ended:
		return io.EOF
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m.(*frameBatch).Frames, s.answers = s.answers, nil
	return nil
}

func (s *heldClient) CloseSend() error { return nil }

// A lone call goes out at once, as a batch of its own; calls made while a
// batch is being sent wait for no timer but go out together in the next
// one; a call whose context ends while it is still queued is reported
// not sent, and its frame never leaves.
func TestFramesQueuedWhileSendingGoOutTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cs := newHeldClient(ctx)
		ms := newMux(cs, cancel)
		var loops sync.WaitGroup
		loops.Go(ms.recvLoop)
		loops.Go(ms.writeLoop)

		type result struct {
			resp *DeliverResponse
			err  error
			sent bool
		}
		results := make([]result, 6)
		var calls sync.WaitGroup
		ask := func(ctx context.Context, i int) {
			calls.Go(func() {
				r := &results[i]
				r.resp, r.err, r.sent = ms.call(ctx, &DeliverRequest{Entity: strconv.Itoa(i)}, time.Minute)
			})
		}
		ask(context.Background(), 0)
		synctest.Wait() // call 0 is being sent (held)
		gone, leave := context.WithCancel(context.Background())
		ask(gone, 1)
		for i := 2; i < 6; i++ {
			ask(context.Background(), i)
		}
		synctest.Wait() // calls 1-5 queued behind it
		leave()
		synctest.Wait() // call 1 gave up
		close(cs.hold)
		calls.Wait()

		for _, b := range cs.batches {
			slices.Sort(b) // (the calls queued in any order)
		}
		if want := [][]string{{"0"}, {"2", "3", "4", "5"}}; !slices.EqualFunc(cs.batches, want, slices.Equal) {
			t.Errorf("batches sent = %q, want %q", cs.batches, want)
		}
		for i, r := range results {
			switch {
			case i == 1:
				if r.sent || !errors.Is(r.err, ErrNotSent) || !errors.Is(r.err, context.Canceled) {
					t.Errorf("call 1 (context ended while queued) = %v, sent %v, %v; want not sent", r.resp, r.sent, r.err)
				}
			case r.err != nil || !r.sent || string(r.resp.Payload) != strconv.Itoa(i):
				t.Errorf("call %d = %v, sent %v, %v", i, r.resp, r.sent, r.err)
			}
		}
		close(cs.ended)
		loops.Wait()
	})
}
