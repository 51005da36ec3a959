package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
)

// The messages of transport.proto, encoded by hand with protowire.

// DeliverRequest is one message for an entity, from the sending runner to
// the owner of its shard.
type DeliverRequest struct {
	Kind, Method, Entity string
	Payload              []byte
	OneWay               bool
	Shard                uint32
	Sender               string
	Codec                string
	// Headers carries context propagated with the request, as a
	// propagation.TextMapCarrier fills it: the W3C trace context
	// (traceparent, tracestate) and baggage. nil when nothing is
	// propagated, and then it costs nothing on the wire. Decoding keeps
	// at most maxHeaders entries of at most maxHeaderBytes (keys and
	// values) in all, in wire order, and drops the others and those with
	// an empty key (no propagator reads one): a peer cannot make a
	// request's headers cost more memory than that.
	Headers map[string]string
	// LocksSeen and RunnersSeen are set on a request sent to the shard's
	// assignee because the sender knows no live owner (0 otherwise): the
	// revisions of the sender's views of the shard locks and of the
	// runner records. A receiver whose views are older than these may
	// wait for them before it decides whether it parks the request.
	LocksSeen, RunnersSeen uint64

	// room is where the answer to a request received on a delivery
	// stream goes (decoded with it: NewResponse).
	room *DeliverResponse
}

// NewResponse returns an empty response to m, for a Handler to fill in
// and return: room allocated with the request when the transport decoded
// it from a delivery stream (no allocation of its own), else a new one.
// Call it at most once per request.
func (m *DeliverRequest) NewResponse() *DeliverResponse {
	if r := m.room; r != nil {
		m.room = nil
		*r = DeliverResponse{}
		return r
	}
	return new(DeliverResponse)
}

// The bounds of the headers a decoded request keeps (DeliverRequest.
// Headers): room for W3C trace context (traceparent, tracestate of at
// most 512 bytes) and baggage (at most 8192 bytes, the limit
// OpenTelemetry's propagator parses), with some to spare.
const (
	maxHeaders     = 32
	maxHeaderBytes = 16 << 10
)

// headerBudget is what a request being decoded may still keep of its
// headers.
type headerBudget struct{ entries, bytes int }

// Code is the outcome of a delivery (transport.proto's Code).
type Code int32

// The codes of transport.proto.
const (
	CodeOK Code = iota
	CodeNotOwner
	CodeUndelivered
	CodeMailboxFull
	CodeUnknownKind
	CodeUnknownMethod
	CodeTooLarge
	CodeBadRequest
	CodeHandlerError
	CodeHandlerPanic
	CodeStaleResult
)

var codeNames = [...]string{"OK", "NOT_OWNER", "UNDELIVERED", "MAILBOX_FULL", "UNKNOWN_KIND",
	"UNKNOWN_METHOD", "TOO_LARGE", "BAD_REQUEST", "HANDLER_ERROR", "HANDLER_PANIC", "STALE_RESULT"}

// String returns the code's name in transport.proto.
func (c Code) String() string {
	if c < 0 || int(c) >= len(codeNames) {
		return fmt.Sprintf("CODE_%d", int32(c))
	}
	return codeNames[c]
}

// Cause says why a message was not delivered (transport.proto's Cause).
type Cause int32

// The causes of transport.proto.
const (
	CauseUnspecified Cause = iota
	CauseDetached
	CauseShardMoved
	CauseShutdown
)

// DeliverResponse is the owner's answer to a DeliverRequest.
type DeliverResponse struct {
	Payload   []byte
	Code      Code
	Message   string
	OwnerHint string
	Shard     uint32
	Cause     Cause
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

// Marshal returns m's protobuf encoding.
func (m *DeliverRequest) Marshal() []byte {
	n := 54 + len(m.Kind) + len(m.Method) + len(m.Entity) + len(m.Payload) + len(m.Sender) + len(m.Codec)
	for k, v := range m.Headers {
		n += 8 + len(k) + len(v)
	}
	return m.appendTo(make([]byte, 0, n))
}

// appendTo appends m's protobuf encoding to b.
func (m *DeliverRequest) appendTo(b []byte) []byte {
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
	b = appendHeaders(b, 9, m.Headers)
	b = appendVarint(b, 10, m.LocksSeen)
	return appendVarint(b, 11, m.RunnersSeen)
}

// size is an upper bound of m's encoded size.
func (m *DeliverRequest) size() int {
	n := 70 + len(m.Kind) + len(m.Method) + len(m.Entity) + len(m.Payload) + len(m.Sender) + len(m.Codec)
	for k, v := range m.Headers {
		n += 16 + len(k) + len(v)
	}
	return n
}

// beginMessage appends the tag of field num holding an embedded message
// and room for its length, which endMessage fills in once the message
// is appended after it: the message is encoded once, in place.
func beginMessage(b []byte, num protowire.Number) ([]byte, int) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return append(b, make([]byte, binary.MaxVarintLen64)...), len(b)
}

// endMessage writes the length of the message appended since
// beginMessage returned at, moving it back over the room left unused.
func endMessage(b []byte, at int) []byte {
	body := len(b) - at - binary.MaxVarintLen64
	var n [binary.MaxVarintLen64]byte
	k := len(protowire.AppendVarint(n[:0], uint64(body)))
	copy(b[at:], n[:k])
	copy(b[at+k:], b[at+binary.MaxVarintLen64:])
	return b[:at+k+body]
}

// appendHeaders appends h as a protobuf map<string, string> field: one
// entry message (key 1, value 2) per pair, in key order so that the
// encoding is canonical.
func appendHeaders(b []byte, num protowire.Number, h map[string]string) []byte {
	if len(h) == 0 {
		return b
	}
	var buf [4]string
	keys := buf[:0]
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := h[k]
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(entrySize(k)+entrySize(v)))
		b = appendString(b, 1, k)
		b = appendString(b, 2, v)
	}
	return b
}

// entrySize is the encoded size of a string field of a map entry (number
// 1 or 2: a one-byte tag), 0 when s is empty (not encoded).
func entrySize(s string) int {
	if s == "" {
		return 0
	}
	return 1 + protowire.SizeBytes(len(s))
}

// decodeHeader decodes one map<string, string> entry into *h (allocated
// at the first entry kept); a key repeated keeps its last value, as
// protobuf requires. An entry beyond what budget has room for, or with
// an empty key, is checked, then dropped.
func decodeHeader(h *map[string]string, b []byte, budget *headerBudget) error {
	var k, val []byte // walk's loop, without a closure to allocate
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: header: %w", ErrMalformed, protowire.ParseError(n))
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("%w: header field %d: %w", ErrMalformed, num, protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			k = v
		case num == 2 && typ == protowire.BytesType:
			val = v
		}
	}
	if len(k) == 0 || budget.entries >= maxHeaders || budget.bytes+len(k)+len(val) > maxHeaderBytes {
		return nil
	}
	budget.entries++
	budget.bytes += len(k) + len(val)
	if *h == nil {
		*h = make(map[string]string, 2)
	}
	(*h)[string(k)] = string(val)
	return nil
}

// Marshal returns m's protobuf encoding.
func (m *DeliverResponse) Marshal() []byte {
	return m.appendTo(make([]byte, 0, m.size()))
}

// appendTo appends m's protobuf encoding to b.
func (m *DeliverResponse) appendTo(b []byte) []byte {
	b = appendBytes(b, 1, m.Payload)
	b = appendVarint(b, 2, uint64(m.Code))
	b = appendString(b, 3, m.Message)
	b = appendString(b, 4, m.OwnerHint)
	b = appendVarint(b, 5, uint64(m.Shard))
	b = appendVarint(b, 6, uint64(m.Cause))
	return appendVarint(b, 7, m.Epoch)
}

// size is an upper bound of m's encoded size.
func (m *DeliverResponse) size() int {
	return 48 + len(m.Payload) + len(m.Message) + len(m.OwnerHint)
}

// ErrMalformed: bytes that are not a valid encoding of a wire message.
var ErrMalformed = errors.New("transport: malformed wire message")

// walk calls field for each field of a protobuf message; unknown fields
// are skipped, as protobuf requires.
func walk(b []byte, field func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %w", ErrMalformed, protowire.ParseError(n))
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
			return fmt.Errorf("%w: field %d: %w", ErrMalformed, num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := field(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

// Unmarshal decodes b into m (unknown fields are skipped); errors match
// ErrMalformed. m keeps no reference to b.
func (m *DeliverRequest) Unmarshal(b []byte) error {
	return m.unmarshal(b, &DeliverRequest{}, false)
}

// unmarshal is Unmarshal, sharing with prev the strings equal to its own
// (the requests of a batch mostly name the same kind, method, sender
// and codec): those cost no allocation. A field repeated keeps its last
// value, as protobuf requires, and only that one is allocated: what a
// request costs is its kept strings, payload and headers, however many
// times a peer repeats a field. With alias set, its strings and payload
// are b's own bytes (no allocation): b must never change (received).
func (m *DeliverRequest) unmarshal(b []byte, prev *DeliverRequest, alias bool) error {
	*m = DeliverRequest{}
	var (
		budget                                       headerBudget
		kind, method, entity, payload, sender, codec []byte
	)
	err := walk(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			kind = v
		case num == 2 && typ == protowire.BytesType:
			method = v
		case num == 3 && typ == protowire.BytesType:
			entity = v
		case num == 4 && typ == protowire.BytesType:
			payload = v
		case num == 5 && typ == protowire.VarintType:
			m.OneWay = x != 0
		case num == 6 && typ == protowire.VarintType:
			m.Shard = uint32(x)
		case num == 7 && typ == protowire.BytesType:
			sender = v
		case num == 8 && typ == protowire.BytesType:
			codec = v
		case num == 9 && typ == protowire.BytesType:
			return decodeHeader(&m.Headers, v, &budget)
		case num == 10 && typ == protowire.VarintType:
			m.LocksSeen = x
		case num == 11 && typ == protowire.VarintType:
			m.RunnersSeen = x
		}
		return nil
	})
	if err != nil {
		return err
	}
	m.Kind, m.Method, m.Entity = text(kind, prev.Kind, alias), text(method, prev.Method, alias), text(entity, prev.Entity, alias)
	m.Sender, m.Codec = text(sender, prev.Sender, alias), text(codec, prev.Codec, alias)
	m.Payload = payloadOf(payload, alias)
	return nil
}

// share returns v as a string: p when they are equal (no allocation).
func share(v []byte, p string) string {
	if string(v) == p {
		return p
	}
	return string(v)
}

// text returns v as a string: with alias, v's own bytes (see received);
// else shared with p when they are equal, or a copy.
func text(v []byte, p string, alias bool) string {
	if alias {
		return unsafe.String(unsafe.SliceData(v), len(v))
	}
	return share(v, p)
}

// payloadOf returns a payload field's bytes v (nil when empty): with
// alias, v itself (see received), its capacity cut to its length so that
// an append never writes over what follows it; else a copy.
func payloadOf(v []byte, alias bool) []byte {
	switch {
	case len(v) == 0:
		return nil
	case alias:
		return v[:len(v):len(v)]
	default:
		return append([]byte(nil), v...)
	}
}

// Unmarshal decodes b into m (unknown fields are skipped); errors match
// ErrMalformed. m keeps no reference to b.
func (m *DeliverResponse) Unmarshal(b []byte) error { return m.unmarshal(b, false) }

// unmarshal is Unmarshal; with alias set, the payload is b's own bytes
// (see received).
func (m *DeliverResponse) unmarshal(b []byte, alias bool) error {
	*m = DeliverResponse{}
	var payload, message, hint []byte // the last of each (see DeliverRequest.unmarshal)
	err := walk(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			payload = v
		case num == 2 && typ == protowire.VarintType:
			m.Code = Code(x)
		case num == 3 && typ == protowire.BytesType:
			message = v
		case num == 4 && typ == protowire.BytesType:
			hint = v
		case num == 5 && typ == protowire.VarintType:
			m.Shard = uint32(x)
		case num == 6 && typ == protowire.VarintType:
			m.Cause = Cause(x)
		case num == 7 && typ == protowire.VarintType:
			m.Epoch = x
		}
		return nil
	})
	if err != nil {
		return err
	}
	m.Payload = payloadOf(payload, alias)
	m.Message, m.OwnerHint = string(message), string(hint) // rare: copied
	return nil
}

type hotRequest struct {
	Shard, Limit uint32
}

// EntityRef names an entity (a Hot answer).
type EntityRef struct{ Kind, ID string }

type hotResponse struct {
	Entities []EntityRef
}

func (m *hotRequest) Marshal() []byte {
	b := appendVarint(nil, 1, uint64(m.Shard))
	return appendVarint(b, 2, uint64(m.Limit))
}

func (m *hotRequest) Unmarshal(b []byte) error {
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

func (m *hotResponse) Marshal() []byte {
	var b []byte
	for _, e := range m.Entities {
		inner := appendString(appendString(nil, 1, e.Kind), 2, e.ID)
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, inner)
	}
	return b
}

// maxHotEntities bounds a Hot answer: what a runner lists at most
// (serveHot), also the most a decoded answer may hold (counted before
// anything is allocated for them).
const maxHotEntities = 4096

func (m *hotResponse) Unmarshal(b []byte) error {
	*m = hotResponse{}
	n, err := countRepeated(b, maxHotEntities, false, "entities")
	if err != nil || n == 0 {
		return err
	}
	m.Entities = make([]EntityRef, 0, n)
	return walk(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		var kind, id []byte // the last of each
		if err := walk(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
			switch {
			case num == 1 && typ == protowire.BytesType:
				kind = v
			case num == 2 && typ == protowire.BytesType:
				id = v
			}
			return nil
		}); err != nil {
			return err
		}
		e := EntityRef{ID: string(id)}
		if i := len(m.Entities); i > 0 {
			e.Kind = share(kind, m.Entities[i-1].Kind)
		} else {
			e.Kind = string(kind)
		}
		m.Entities = append(m.Entities, e)
		return nil
	})
}
