package storage

import (
	"errors"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
)

// FuzzDecodeCluster: decoding the cluster record never panics; an error is
// a *CorruptError naming the cluster key, and the ClusterInfo still carries
// the ModRevision; a decoded record encodes and decodes to itself; an
// encodable record decodes to itself (a layout below 2 as the layout a
// record without one means), and encoding any other fails with
// ErrInvalidArgument; a record of layout 2 or later carries it in its
// strategy member too.
func FuzzDecodeCluster(f *testing.F) {
	f.Add([]byte(`{"numShards":256,"strategy":"balanced","writtenBy":"r1"}`), int64(4), 256, "balanced", "r1", 0)
	f.Add([]byte(`{"numShards":256,"strategy":"balanced (layout 2)","layout":2}`), int64(4), 256, "balanced", "r1", 2)
	f.Add([]byte(`{"numShards":256,"strategy":"balanced","layout":2}`), int64(4), 256, "balanced", "r1", 1)
	f.Add([]byte(`{"numShards":16}`), int64(1), 16, "", "", 2)
	f.Add([]byte(`{"numShards":0}`), int64(0), 0, "a/b", "\x01", -1)
	f.Add([]byte(`{"numShards":16,"numShards":32}`), int64(-1), sharding.MaxShards+1, "sticky", "", 3)
	f.Add([]byte(`null`), int64(2), -1, "", "r", 0)
	f.Add([]byte(`{"numShards":1e2}`), int64(2), 1, "x", "y", 0)
	f.Fuzz(func(t *testing.T, value []byte, rev int64, numShards int, strategy, writtenBy string, layout int) {
		info, err := DecodeCluster(KeyValue{Key: ClusterKey, Value: value, ModRevision: Revision(rev)})
		if info.ModRevision != Revision(rev) {
			t.Fatalf("DecodeCluster(%q) = %+v, want ModRevision %d", value, info, rev)
		}
		if err != nil {
			checkCorrupt(t, "DecodeCluster", err, "", ClusterKey)
		} else {
			b, err := EncodeCluster(info.ClusterRecord)
			if err != nil {
				t.Fatalf("EncodeCluster(decoded %+v) = %v", info.ClusterRecord, err)
			}
			if info2, err := DecodeCluster(KeyValue{Key: ClusterKey, Value: b, ModRevision: Revision(rev)}); err != nil || info2 != info {
				t.Fatalf("round trip of %+v = %+v, %v", info, info2, err)
			}
		}
		rec := ClusterRecord{NumShards: numShards, Strategy: strategy, WrittenBy: writtenBy, Layout: layout}
		if b, err := EncodeCluster(rec); err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("EncodeCluster(%+v) = %v, want ErrInvalidArgument", rec, err)
			}
		} else {
			want := rec // a record without a layout member is layout 1 if it names a strategy
			if want.Layout <= 1 {
				want.Layout = 0
				if want.Strategy != "" {
					want.Layout = 1
				}
			}
			got, err := DecodeCluster(KeyValue{Key: ClusterKey, Value: b, ModRevision: 3})
			if err != nil || got != (ClusterInfo{ClusterRecord: want, ModRevision: 3}) {
				t.Fatalf("DecodeCluster(EncodeCluster(%+v)) = %+v, %v", rec, got, err)
			}
		}
	})
}

// FuzzDecodeDrain: decoding a drain request never panics; an error is a
// *CorruptError naming the key; a valid key names its runner whatever the
// value, an invalid one none; a decoded request encodes and decodes to
// itself (times compared as instants); an encodable request decodes to
// itself, and encoding any other fails with ErrInvalidArgument.
func FuzzDecodeDrain(f *testing.F) {
	f.Add("r1", []byte(`{"requested":"2026-01-02T03:04:05.000000006Z","by":"ops@host","reason":"kernel upgrade"}`), "r1", int64(1767323045), int64(6), "ops@host", "kernel upgrade")
	f.Add("r1", []byte(`{"requested":"2026-01-02T03:04:05+01:00"}`), "r1", int64(0), int64(0), "", "")
	f.Add("r2", []byte(`{`), "r2", int64(-62135596800), int64(0), "", "")
	f.Add("", []byte(`{}`), "a/b", int64(253402300800), int64(0), "\xff", "")
	f.Add("r3", []byte(`{"requested":null,"by":1}`), "", int64(-1), int64(-1), "", "\x00")
	f.Fuzz(func(t *testing.T, key string, value []byte, id string, sec, nsec int64, by, reason string) {
		got, req, err := DecodeDrain(KeyValue{Key: key, Value: value})
		if err != nil {
			checkCorrupt(t, "DecodeDrain", err, KeyspaceDrains, key)
		}
		if ValidateRunnerID(key) == nil {
			if got != key {
				t.Fatalf("DecodeDrain(%q) names runner %q", key, got)
			}
		} else if got != "" || err == nil {
			t.Fatalf("DecodeDrain(bad key %q) = %q, %v; want no runner and an error", key, got, err)
		}
		if err == nil {
			b, err := EncodeDrain(key, req)
			if err != nil {
				t.Fatalf("EncodeDrain(decoded %+v) = %v", req, err)
			}
			if got2, req2, err := DecodeDrain(KeyValue{Key: key, Value: b}); err != nil || got2 != key || !sameDrain(req2, req) {
				t.Fatalf("round trip of %+v = %q, %+v, %v", req, got2, req2, err)
			}
		}
		in := DrainRequest{Requested: time.Unix(sec, nsec).UTC(), By: by, Reason: reason}
		if b, err := EncodeDrain(id, in); err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("EncodeDrain(%q, %+v) = %v, want ErrInvalidArgument", id, in, err)
			}
		} else {
			got, req, err := DecodeDrain(KeyValue{Key: id, Value: b})
			if err != nil || got != id || !sameDrain(req, in) {
				t.Fatalf("DecodeDrain(EncodeDrain(%q, %+v)) = %q, %+v, %v", id, in, got, req, err)
			}
		}
	})
}

// sameDrain compares drain requests, times by instant.
func sameDrain(a, b DrainRequest) bool {
	return a.Requested.Equal(b.Requested) && a.By == b.By && a.Reason == b.Reason
}
