package entity

import "encoding/json"

// Codec encodes requests and responses when a message leaves the process.
// Local delivery never encodes. Implementations must be safe for concurrent
// use.
type Codec interface {
	Name() string
	Marshal(v any) ([]byte, error)
	Unmarshal(b []byte, v any) error
}

// JSON is the default codec: encoding/json.
var JSON Codec = jsonCodec{}

type jsonCodec struct{}

func (jsonCodec) Name() string                    { return "json" }
func (jsonCodec) Marshal(v any) ([]byte, error)   { return json.Marshal(v) }
func (jsonCodec) Unmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
