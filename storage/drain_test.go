package storage_test

import (
	"errors"
	"testing"
	"time"

	"github.com/shardhost/shardhost/storage"
)

func TestDrainRequestRoundTrip(t *testing.T) {
	req := storage.DrainRequest{Requested: time.Unix(100, 0).UTC(), By: "ops@host", Reason: "kernel upgrade"}
	b, err := storage.EncodeDrain("r1", req)
	if err != nil {
		t.Fatal(err)
	}
	id, got, err := storage.DecodeDrain(storage.KeyValue{Key: "r1", Value: b})
	if err != nil || id != "r1" || got != req {
		t.Errorf("DecodeDrain = %q, %+v, %v; want r1, %+v", id, got, err, req)
	}
	if _, err := storage.EncodeDrain("a/b", req); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Errorf("EncodeDrain of a bad ID: %v, want ErrInvalidArgument", err)
	}
	// A corrupt value still names the runner whose drain it requests.
	id, _, err = storage.DecodeDrain(storage.KeyValue{Key: "r2", Value: []byte("{")})
	var ce *storage.CorruptError
	if id != "r2" || !errors.As(err, &ce) {
		t.Errorf("DecodeDrain of a corrupt value = %q, %v; want r2 and a *CorruptError", id, err)
	}
	if id, _, err := storage.DecodeDrain(storage.KeyValue{Key: "", Value: b}); id != "" || !errors.As(err, &ce) {
		t.Errorf("DecodeDrain of an empty key = %q, %v; want no runner and a *CorruptError", id, err)
	}
	if storage.DrainKey("r1") != "drains/r1" {
		t.Errorf("DrainKey(r1) = %q", storage.DrainKey("r1"))
	}
}
