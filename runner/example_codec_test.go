package runner_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/entity/protocodec"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

// Meter's requests and responses are protocol buffer messages (generated
// types; here two well-known ones).
type Meter struct{ total int64 }

func (m *Meter) Record(_ context.Context, r *wrapperspb.Int64Value) (*wrapperspb.Int64Value, error) {
	m.total += r.GetValue()
	return wrapperspb.Int64(m.total), nil
}

var (
	// The kind's messages leave the process in the protocol buffer binary
	// format instead of JSON. Every runner registers the kind with the
	// same codec.
	MeterKind = entity.NewKind("meter", func(string) *Meter { return &Meter{} }, entity.WithCodec(protocodec.Codec))
	Record    = entity.Method(MeterKind, "record", (*Meter).Record)
)

// A kind with the protocol buffer codec: a gateway's asks reach the owner
// over gRPC encoded as protocol buffers.
func Example_protocolBuffers() {
	cluster := memory.NewCluster() // storage/etcd in production
	defer cluster.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	owner, _ := runner.New(cluster.NewStore("owner"), runner.Config{ID: "owner", NumShards: 16, ListenAddr: "127.0.0.1:0", Logger: quiet})
	gateway, _ := runner.New(cluster.NewStore("gateway"), runner.Config{ID: "gateway", NumShards: 16, ClientOnly: true, Logger: quiet})
	for _, r := range []*runner.Runner{owner, gateway} {
		if err := r.Register(MeterKind); err != nil {
			panic(err)
		}
		go r.Run(context.Background())
		defer r.Shutdown(context.Background())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Retried inside Ask until the owner has the meter's shard.
	if _, err := Record.Ask(ctx, gateway, "meter-7", wrapperspb.Int64(40)); err != nil {
		panic(err)
	}
	total, err := Record.Ask(ctx, gateway, "meter-7", wrapperspb.Int64(2))
	fmt.Println(total.GetValue(), err)
	// Output:
	// 42 <nil>
}
