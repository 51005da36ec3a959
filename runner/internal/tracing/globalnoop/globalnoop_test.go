// Package globalnoop_test checks, in a test binary of its own (the
// process's global provider cannot be unset), that a runner's tracer made
// on the global provider stays off when a program sets the global
// provider to a no-op one.
package globalnoop_test

import (
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/shardhost/shardhost/runner/internal/tracing"
)

// TestGlobalSetToNoopIsOff: the global provider, unset then set to a
// noop.TracerProvider, leaves a tracer following it off (and On still
// allocates nothing).
func TestGlobalSetToNoopIsOff(t *testing.T) {
	global := otel.GetTracerProvider()
	if !tracing.IsGlobalStandIn(global) {
		t.Fatalf("the global provider is a %T before this test set one", global)
	}
	tr := tracing.New(global, propagation.TraceContext{}, "r")
	if tr.On() {
		t.Fatal("on while the global provider is unset")
	}
	otel.SetTracerProvider(noop.NewTracerProvider())
	if tr.On() {
		t.Error("on after otel.SetTracerProvider(noop.NewTracerProvider())")
	}
	if n := testing.AllocsPerRun(100, func() { tr.On() }); n != 0 {
		t.Errorf("On() allocates %v times", n)
	}
}
