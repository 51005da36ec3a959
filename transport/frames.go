package transport

import (
	"encoding/binary"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// frame is a message of the multiplexed Stream.
type frame struct {
	ID        uint64
	Req       *DeliverRequest
	Resp      *DeliverResponse
	TimeoutMs uint32
	GoAway    bool
}

// decodedFrame is a frame with room for its request or response: a
// batch decodes its frames into one slice of them (one allocation).
type decodedFrame struct {
	f    frame
	req  DeliverRequest
	resp DeliverResponse
}

func (m *frame) Marshal() []byte {
	return m.appendTo(make([]byte, 0, m.size()))
}

// size is an upper bound of m's encoded size.
func (m *frame) size() int {
	n := 32
	if m.Req != nil {
		n += binary.MaxVarintLen64 + m.Req.size()
	}
	if m.Resp != nil {
		n += binary.MaxVarintLen64 + m.Resp.size()
	}
	return n
}

// appendTo appends m's protobuf encoding to b.
func (m *frame) appendTo(b []byte) []byte {
	b = appendVarint(b, 1, m.ID)
	var at int
	if m.Req != nil {
		b, at = beginMessage(b, 2)
		b = endMessage(m.Req.appendTo(b), at)
	}
	if m.Resp != nil {
		b, at = beginMessage(b, 3)
		b = endMessage(m.Resp.appendTo(b), at)
	}
	b = appendVarint(b, 4, uint64(m.TimeoutMs))
	if m.GoAway {
		b = appendVarint(b, 5, 1)
	}
	return b
}

func (m *frame) Unmarshal(b []byte) error {
	return m.unmarshal(b, &DeliverRequest{}, nil, false)
}

// unmarshal is Unmarshal, sharing strings with prev (see
// DeliverRequest.unmarshal) or aliasing b (alias), and decoding the
// request or response into room's (nil: new ones; a request decoded
// into room's answers into it too: NewResponse). A request or response
// repeated keeps the last (decoded once: the earlier ones are only
// checked to be well formed messages at the frame's level).
func (m *frame) unmarshal(b []byte, prev *DeliverRequest, room *decodedFrame, alias bool) error {
	*m = frame{}
	var req, resp []byte
	hasReq, hasResp := false, false
	err := walk(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.VarintType:
			m.ID = x
		case num == 2 && typ == protowire.BytesType:
			req, hasReq = v, true
		case num == 3 && typ == protowire.BytesType:
			resp, hasResp = v, true
		case num == 4 && typ == protowire.VarintType:
			m.TimeoutMs = uint32(x)
		case num == 5 && typ == protowire.VarintType:
			m.GoAway = x != 0
		}
		return nil
	})
	if err != nil {
		return err
	}
	if hasReq {
		if room != nil {
			m.Req = &room.req
		} else {
			m.Req = new(DeliverRequest)
		}
		if err := m.Req.unmarshal(req, prev, alias); err != nil {
			return err
		}
		if room != nil && !hasResp {
			m.Req.room = &room.resp
		}
	}
	if hasResp {
		if room != nil {
			m.Resp = &room.resp
		} else {
			m.Resp = new(DeliverResponse)
		}
		if err := m.Resp.unmarshal(resp, alias); err != nil {
			return err
		}
	}
	return nil
}

// frameBatch is a message of the Frames stream: the frames one side
// sent together (transport.proto, Frames).
type frameBatch struct {
	Frames []*frame
}

func (m *frameBatch) Marshal() []byte {
	return m.appendTo(make([]byte, 0, m.size())) // one allocation, sized up front
}

// size is an upper bound of m's encoded size.
func (m *frameBatch) size() int {
	n := 0
	for _, f := range m.Frames {
		n += binary.MaxVarintLen64 + 1 + f.size()
	}
	return n
}

// appendTo appends m's protobuf encoding to b.
func (m *frameBatch) appendTo(b []byte) []byte {
	var at int
	for _, f := range m.Frames {
		b, at = beginMessage(b, 1)
		b = endMessage(f.appendTo(b), at)
	}
	return b
}

// countRepeated counts the messages of field 1 (repeated) in b, the
// empty ones only unless skipEmpty; more than most is malformed.
func countRepeated(b []byte, most int, skipEmpty bool, what string) (int, error) {
	n := 0
	err := walk(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num == 1 && typ == protowire.BytesType && (len(v) > 0 || !skipEmpty) {
			if n++; n > most {
				return fmt.Errorf("%w: more than %d %s", ErrMalformed, most, what)
			}
		}
		return nil
	})
	return n, err
}

// maxRecvBatchFrames bounds the frames of a batch received: twice what
// a sender puts in one (maxBatchFrames). A batch with more is malformed,
// refused before anything is allocated for its frames.
const maxRecvBatchFrames = 2 * maxBatchFrames

// Unmarshal decodes b into m: the frames are allocated together, once
// they are counted (at most maxRecvBatchFrames). A frame that carries
// nothing (empty, or no field but unknown ones and zeros) is dropped and
// costs no allocation: every frame kept is at least 4 bytes on the wire,
// for sizeof(decodedFrame) + a pointer (264 bytes) of room. m keeps no
// reference to b.
func (m *frameBatch) Unmarshal(b []byte) error { return m.decode(b, false) }

// oneFrame is the room of a batch of one frame: one allocation.
type oneFrame struct {
	d [1]decodedFrame
	p [1]*frame
}

// decode is Unmarshal; with alias set, the strings and payloads of the
// frames are b's own bytes (see received), and a batch of one frame
// costs one allocation.
func (m *frameBatch) decode(b []byte, alias bool) error {
	*m = frameBatch{}
	n, err := countRepeated(b, maxRecvBatchFrames, true, "frames")
	if err != nil || n == 0 {
		return err
	}
	var frames []decodedFrame
	if n == 1 {
		one := new(oneFrame)
		frames, m.Frames = one.d[:], one.p[:0]
	} else {
		frames, m.Frames = make([]decodedFrame, n), make([]*frame, 0, n)
	}
	prev := &DeliverRequest{}
	return walk(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num != 1 || typ != protowire.BytesType || len(v) == 0 {
			return nil
		}
		d := &frames[len(m.Frames)]
		f := &d.f
		if err := f.unmarshal(v, prev, d, alias); err != nil {
			return err
		}
		if *f == (frame{}) {
			return nil // carries nothing: its room serves the next frame
		}
		m.Frames = append(m.Frames, f)
		if f.Req != nil {
			prev = f.Req
		}
		return nil
	})
}
