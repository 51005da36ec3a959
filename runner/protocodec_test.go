package runner_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/entity/protocodec"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

// tallies is Meter (example_codec_test.go) as a remembered kind.
var (
	tallies  = entity.NewKind("tally", func(string) *Meter { return &Meter{} }, entity.WithCodec(protocodec.Codec), entity.Remembered())
	tallyAdd = entity.Method(tallies, "add", (*Meter).Record)
)

// A kind with the protocol buffer codec travels between two runners over
// gRPC: asks are encoded in the binary format and answered, Remember (whose
// empty request has no protocol buffer encoding) reaches the owner, and a
// runner whose kind of the same name uses JSON refuses the message with
// ErrBadRequest naming both codecs.
func TestProtocolBufferKindTravelsBetweenRunners(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func(cfg runner.Config, k entity.Descriptor) *runner.Runner {
		r, err := runner.New(c.NewStore(cfg.ID), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(k); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(context.Background()) }()
		t.Cleanup(func() { r.Close(); <-done })
		return r
	}
	start(runner.Config{ID: "owner", NumShards: 8, ListenAddr: "127.0.0.1:0", Logger: quiet}, tallies)
	client := start(runner.Config{ID: "client", NumShards: 8, ClientOnly: true, Logger: quiet}, tallies)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var got *wrapperspb.Int64Value
	for { // until the client routes to the owner
		actx, acancel := context.WithTimeout(ctx, time.Second)
		var err error
		got, err = tallyAdd.Ask(actx, client, "a", wrapperspb.Int64(40))
		acancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no answer from the owner: %v", err)
		}
	}
	if got.GetValue() != 40 {
		t.Fatalf("first ask = %v, want 40", got)
	}
	if got, err := tallyAdd.Ask(ctx, client, "a", wrapperspb.Int64(2)); err != nil || got.GetValue() != 42 {
		t.Fatalf("second ask = %v, %v; want 42", got, err)
	}
	if got, err := tallyAdd.Ask(ctx, client, "b", nil); err != nil || got.GetValue() != 0 {
		t.Fatalf("ask with a nil message = %v, %v; want 0 (sent as an empty message)", got, err)
	}
	if err := entity.Remember(ctx, client, tallies, "r"); err != nil {
		t.Fatalf("Remember through the client: %v", err)
	}

	// The same kind name with JSON on the sending side: refused by the
	// owner, naming both codecs.
	jsonTallies := entity.NewKind("tally", func(string) *Meter { return &Meter{} })
	type plainReq struct{ N int64 }
	jsonAdd := entity.Method(jsonTallies, "add", func(*Meter, context.Context, plainReq) (int64, error) { return 0, nil })
	other := start(runner.Config{ID: "json-client", NumShards: 8, ClientOnly: true, Logger: quiet}, jsonTallies)
	var err error
	for ctx.Err() == nil {
		_, err = jsonAdd.Ask(ctx, other, "a", plainReq{N: 1})
		if errors.Is(err, entity.ErrBadRequest) {
			break
		}
		time.Sleep(10 * time.Millisecond) // not routed yet
	}
	if !errors.Is(err, entity.ErrBadRequest) || !strings.Contains(err.Error(), `codec "json", kind "tally" uses "proto"`) {
		t.Fatalf("ask with JSON to a proto kind = %v, want ErrBadRequest naming both codecs", err)
	}
}
