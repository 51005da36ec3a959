package main

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Span is one exported span, as the waterfall draws it.
type Span struct {
	TraceID  string // 32 hex digits
	SpanID   string // 16 hex digits
	ParentID string // the parent's span ID, "" for a root
	Name     string
	Kind     string // internal, server, client, producer, consumer (unspecified: "")
	Start    time.Time
	End      time.Time
	Attrs    []Attr
	Events   []Event
	Error    bool   // an error status
	Status   string // the error status's description
	Process  string // the resource's service.instance.id, or the file's name without one
	Source   string // file:line it was read from
}

// Duration is how long the span lasted.
func (s Span) Duration() time.Duration { return s.End.Sub(s.Start) }

// Attr is an attribute, its value as text.
type Attr struct{ Key, Value string }

// Event is a span event.
type Event struct {
	Name  string
	Time  time.Time
	Attrs []Attr
}

// FormatError reports a line of a span file that is not a span as
// OpenTelemetry's stdout exporter writes it.
type FormatError struct {
	File string
	Line int
	Err  error
}

func (e *FormatError) Error() string { return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err) }

func (e *FormatError) Unwrap() error { return e.Err }

// stub is the JSON of a span by go.opentelemetry.io/otel/exporters/stdout/stdouttrace
// (tracetest.SpanStub); only the fields drawn are read.
type stub struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
	SpanKind    int
	StartTime   time.Time
	EndTime     time.Time
	Attributes  []keyValue
	Events      []struct {
		Name       string
		Attributes []keyValue
		Time       time.Time
	}
	Status   struct{ Code, Description string }
	Resource []keyValue
}

type keyValue struct {
	Key   string
	Value struct {
		Type  string
		Value any
	}
}

var kinds = []string{"", "internal", "server", "client", "producer", "consumer"}

// readSpans reads the spans of one file (JSON, one span a line; blank
// lines skipped). name is the file's name, for errors and as the process
// of spans without a service.instance.id.
func readSpans(r io.Reader, name string) ([]Span, error) {
	var out []Span
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 16<<20)
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		s, err := parseSpan(b)
		if err != nil {
			return nil, &FormatError{File: name, Line: line, Err: err}
		}
		if s.Process == "" {
			s.Process = name
		}
		s.Source = fmt.Sprintf("%s:%d", name, line)
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return out, nil
}

func parseSpan(b []byte) (Span, error) {
	var st stub
	if err := json.Unmarshal(b, &st); err != nil {
		return Span{}, err
	}
	switch {
	case !isHexID(st.SpanContext.TraceID, 16):
		return Span{}, fmt.Errorf("trace ID %q: want 32 hex digits, not all zero", st.SpanContext.TraceID)
	case !isHexID(st.SpanContext.SpanID, 8):
		return Span{}, fmt.Errorf("span ID %q: want 16 hex digits, not all zero", st.SpanContext.SpanID)
	case st.StartTime.IsZero() || st.EndTime.Before(st.StartTime):
		return Span{}, fmt.Errorf("span %s: start %v, end %v: want a start, and an end not before it", st.SpanContext.SpanID, st.StartTime, st.EndTime)
	case st.SpanKind < 0 || st.SpanKind >= len(kinds):
		return Span{}, fmt.Errorf("span %s: kind %d", st.SpanContext.SpanID, st.SpanKind)
	}
	s := Span{
		TraceID: st.SpanContext.TraceID,
		SpanID:  st.SpanContext.SpanID,
		Name:    st.Name,
		Kind:    kinds[st.SpanKind],
		Start:   st.StartTime,
		End:     st.EndTime,
		Attrs:   attrs(st.Attributes),
		Error:   st.Status.Code == "Error",
		Status:  st.Status.Description,
	}
	if isHexID(st.Parent.SpanID, 8) {
		s.ParentID = st.Parent.SpanID
	}
	for _, e := range st.Events {
		s.Events = append(s.Events, Event{Name: e.Name, Time: e.Time, Attrs: attrs(e.Attributes)})
	}
	for _, kv := range st.Resource {
		if kv.Key == "service.instance.id" {
			s.Process = fmt.Sprint(kv.Value.Value)
		}
	}
	if s.Name == "" {
		return Span{}, errors.New("span " + s.SpanID + ": no name")
	}
	return s, nil
}

func attrs(kvs []keyValue) []Attr {
	out := make([]Attr, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, Attr{Key: kv.Key, Value: fmt.Sprint(kv.Value.Value)})
	}
	return out
}

// isHexID reports whether s is n bytes in hex, not all zero.
func isHexID(s string, n int) bool {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != n {
		return false
	}
	for _, c := range b {
		if c != 0 {
			return true
		}
	}
	return false
}
