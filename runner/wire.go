package runner

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// The messages of transport.proto, encoded by hand with protowire.

type deliverRequest struct {
	Kind, Method, Entity string
	Payload              []byte
	OneWay               bool
	Shard                uint32
	Sender               string
	Codec                string
}

type wireCode int32

const (
	codeOK wireCode = iota
	codeNotOwner
	codeUndelivered
	codeMailboxFull
	codeUnknownKind
	codeUnknownMethod
	codeTooLarge
	codeBadRequest
	codeHandlerError
	codeHandlerPanic
	codeStaleResult
)

var codeNames = [...]string{"OK", "NOT_OWNER", "UNDELIVERED", "MAILBOX_FULL", "UNKNOWN_KIND",
	"UNKNOWN_METHOD", "TOO_LARGE", "BAD_REQUEST", "HANDLER_ERROR", "HANDLER_PANIC", "STALE_RESULT"}

// String returns the code's name in transport.proto.
func (c wireCode) String() string {
	if c < 0 || int(c) >= len(codeNames) {
		return fmt.Sprintf("CODE_%d", int32(c))
	}
	return codeNames[c]
}

type wireCause int32

const (
	causeUnspecified wireCause = iota
	causeDetached
	causeShardMoved
	causeShutdown
)

type deliverResponse struct {
	Payload   []byte
	Code      wireCode
	Message   string
	OwnerHint string
	Shard     uint32
	Cause     wireCause
	Epoch     uint64 // the epoch the handler ran under (results only)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func (m *deliverRequest) marshal() []byte {
	b := make([]byte, 0, 32+len(m.Kind)+len(m.Method)+len(m.Entity)+len(m.Payload)+len(m.Sender)+len(m.Codec))
	b = appendString(b, 1, m.Kind)
	b = appendString(b, 2, m.Method)
	b = appendString(b, 3, m.Entity)
	b = appendBytes(b, 4, m.Payload)
	if m.OneWay {
		b = appendVarint(b, 5, 1)
	}
	b = appendVarint(b, 6, uint64(m.Shard))
	b = appendString(b, 7, m.Sender)
	b = appendString(b, 8, m.Codec)
	return b
}

func (m *deliverResponse) marshal() []byte {
	b := make([]byte, 0, 24+len(m.Payload)+len(m.Message)+len(m.OwnerHint))
	b = appendBytes(b, 1, m.Payload)
	b = appendVarint(b, 2, uint64(m.Code))
	b = appendString(b, 3, m.Message)
	b = appendString(b, 4, m.OwnerHint)
	b = appendVarint(b, 5, uint64(m.Shard))
	b = appendVarint(b, 6, uint64(m.Cause))
	b = appendVarint(b, 7, m.Epoch)
	return b
}

var errWire = errors.New("runner: malformed wire message")

// walk calls field for each field of a protobuf message; unknown fields
// are skipped, as protobuf requires.
func walk(b []byte, field func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %w", errWire, protowire.ParseError(n))
		}
		b = b[n:]
		var (
			v []byte
			x uint64
		)
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("%w: field %d: %w", errWire, num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := field(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

func (m *deliverRequest) unmarshal(b []byte) error {
	*m = deliverRequest{}
	return walk(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			m.Kind = string(v)
		case num == 2 && typ == protowire.BytesType:
			m.Method = string(v)
		case num == 3 && typ == protowire.BytesType:
			m.Entity = string(v)
		case num == 4 && typ == protowire.BytesType:
			m.Payload = append([]byte(nil), v...)
		case num == 5 && typ == protowire.VarintType:
			m.OneWay = x != 0
		case num == 6 && typ == protowire.VarintType:
			m.Shard = uint32(x)
		case num == 7 && typ == protowire.BytesType:
			m.Sender = string(v)
		case num == 8 && typ == protowire.BytesType:
			m.Codec = string(v)
		}
		return nil
	})
}

func (m *deliverResponse) unmarshal(b []byte) error {
	*m = deliverResponse{}
	return walk(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			m.Payload = append([]byte(nil), v...)
		case num == 2 && typ == protowire.VarintType:
			m.Code = wireCode(x)
		case num == 3 && typ == protowire.BytesType:
			m.Message = string(v)
		case num == 4 && typ == protowire.BytesType:
			m.OwnerHint = string(v)
		case num == 5 && typ == protowire.VarintType:
			m.Shard = uint32(x)
		case num == 6 && typ == protowire.VarintType:
			m.Cause = wireCause(x)
		case num == 7 && typ == protowire.VarintType:
			m.Epoch = x
		}
		return nil
	})
}

// frame is a message of the multiplexed Stream.
type frame struct {
	ID        uint64
	Req       *deliverRequest
	Resp      *deliverResponse
	TimeoutMs uint32
	GoAway    bool
}

func (m *frame) marshal() []byte {
	var req, resp []byte
	if m.Req != nil {
		req = m.Req.marshal()
	}
	if m.Resp != nil {
		resp = m.Resp.marshal()
	}
	b := make([]byte, 0, 32+len(req)+len(resp)) // one allocation, sized up front
	b = appendVarint(b, 1, m.ID)
	if m.Req != nil {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, req)
	}
	if m.Resp != nil {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, resp)
	}
	b = appendVarint(b, 4, uint64(m.TimeoutMs))
	if m.GoAway {
		b = appendVarint(b, 5, 1)
	}
	return b
}

func (m *frame) unmarshal(b []byte) error {
	*m = frame{}
	return walk(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.VarintType:
			m.ID = x
		case num == 2 && typ == protowire.BytesType:
			m.Req = new(deliverRequest)
			return m.Req.unmarshal(v)
		case num == 3 && typ == protowire.BytesType:
			m.Resp = new(deliverResponse)
			return m.Resp.unmarshal(v)
		case num == 4 && typ == protowire.VarintType:
			m.TimeoutMs = uint32(x)
		case num == 5 && typ == protowire.VarintType:
			m.GoAway = x != 0
		}
		return nil
	})
}

type hotRequest struct {
	Shard, Limit uint32
}

type entityRef struct{ Kind, ID string }

type hotResponse struct {
	Entities []entityRef
}

func (m *hotRequest) marshal() []byte {
	b := appendVarint(nil, 1, uint64(m.Shard))
	return appendVarint(b, 2, uint64(m.Limit))
}

func (m *hotRequest) unmarshal(b []byte) error {
	*m = hotRequest{}
	return walk(b, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.VarintType:
			m.Shard = uint32(x)
		case num == 2 && typ == protowire.VarintType:
			m.Limit = uint32(x)
		}
		return nil
	})
}

func (m *hotResponse) marshal() []byte {
	var b []byte
	for _, e := range m.Entities {
		inner := appendString(appendString(nil, 1, e.Kind), 2, e.ID)
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, inner)
	}
	return b
}

func (m *hotResponse) unmarshal(b []byte) error {
	*m = hotResponse{}
	return walk(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		var e entityRef
		if err := walk(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
			switch {
			case num == 1 && typ == protowire.BytesType:
				e.Kind = string(v)
			case num == 2 && typ == protowire.BytesType:
				e.ID = string(v)
			}
			return nil
		}); err != nil {
			return err
		}
		m.Entities = append(m.Entities, e)
		return nil
	})
}

// wireCodec is the gRPC codec of the runner service.
type wireCodec struct{}

func (wireCodec) Name() string { return "shardhost-v1" }

func (wireCodec) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case *deliverRequest:
		return m.marshal(), nil
	case *deliverResponse:
		return m.marshal(), nil
	case *hotRequest:
		return m.marshal(), nil
	case *hotResponse:
		return m.marshal(), nil
	case *frame:
		return m.marshal(), nil
	default:
		return nil, fmt.Errorf("%w: cannot marshal %T", errWire, v)
	}
}

func (wireCodec) Unmarshal(b []byte, v any) error {
	switch m := v.(type) {
	case *deliverRequest:
		return m.unmarshal(b)
	case *deliverResponse:
		return m.unmarshal(b)
	case *hotRequest:
		return m.unmarshal(b)
	case *hotResponse:
		return m.unmarshal(b)
	case *frame:
		return m.unmarshal(b)
	default:
		return fmt.Errorf("%w: cannot unmarshal into %T", errWire, v)
	}
}
