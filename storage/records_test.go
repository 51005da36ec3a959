package storage

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
)

// sameRunner compares records, times by instant (JSON keeps no monotonic
// reading or location).
func sameRunner(a, b RunnerRecord) bool {
	if !a.Started.Equal(b.Started) {
		return false
	}
	a.Started, b.Started = time.Time{}, time.Time{}
	return a == b
}

func checkCorrupt(t *testing.T, what string, err error, ks Keyspace, key string) {
	t.Helper()
	var ce *CorruptError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.Keyspace != ks || ce.Key != key {
		t.Errorf("%s = %v, want a *CorruptError naming %s/%s", what, err, ks, key)
	}
}

var goodRunner = `{"id":"r1","address":"10.0.0.5:7100","weight":1,"incarnation":"i1","started":"2026-01-02T03:04:05.000000006Z"}`

// TestRunnerRecordCarriesItsDebugURL: a runner record round-trips its
// debug URL; a record without one (an older runner's) decodes with none;
// a URL that is not absolute http(s) is refused when encoding and makes a
// stored record corrupt.
func TestRunnerRecordCarriesItsDebugURL(t *testing.T) {
	rec := RunnerRecord{ID: "r1", Incarnation: "i1", Weight: 1, Started: time.Unix(1767323045, 0).UTC(),
		DebugURL: "http://10.0.0.5:8081/debug/shardhost/"}
	b, err := EncodeRunner(rec)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeRunner(KeyValue{Key: "r1", Value: b}); err != nil || got.DebugURL != rec.DebugURL {
		t.Errorf("DecodeRunner(EncodeRunner(%q)) = %q, %v", rec.DebugURL, got.DebugURL, err)
	}
	if got, err := DecodeRunner(KeyValue{Key: "r1", Value: []byte(goodRunner)}); err != nil || got.DebugURL != "" {
		t.Errorf("DecodeRunner(a record without debugURL) = %q, %v; want none", got.DebugURL, err)
	}
	for _, bad := range []string{"10.0.0.5:8081/debug", "ftp://h/x", "http:///x", "/debug/shardhost/", "http://h/\x01"} {
		rec.DebugURL = bad
		if _, err := EncodeRunner(rec); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("EncodeRunner(DebugURL %q) = %v, want ErrInvalidArgument", bad, err)
		}
		q, _ := json.Marshal(bad)
		v := []byte(`{"id":"r1","weight":1,"incarnation":"i1","started":"2026-01-02T03:04:05Z","debugURL":` + string(q) + `}`)
		if _, err := DecodeRunner(KeyValue{Key: "r1", Value: v}); err == nil {
			t.Errorf("DecodeRunner(debugURL %q) succeeded, want a corrupt record", bad)
		}
	}
}

// TestStoppedRunnerRecordHasNoWeightAndIsDraining: the marker of a clean
// Shutdown round-trips; an older runner's record has none; a record that
// says stopped yet has a weight or is not draining is refused when encoding
// and corrupt when stored (it would both take shards and claim it released
// them all).
func TestStoppedRunnerRecordHasNoWeightAndIsDraining(t *testing.T) {
	rec := RunnerRecord{ID: "r1", Incarnation: "i1", Started: time.Unix(1767323045, 0).UTC(), Draining: true, Stopped: true}
	b, err := EncodeRunner(rec)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeRunner(KeyValue{Key: "r1", Value: b, Lease: 5}); err != nil || !got.Stopped || got.Weight != 0 || !got.Draining {
		t.Errorf("DecodeRunner(EncodeRunner(stopped)) = %+v, %v", got, err)
	}
	if got, err := DecodeRunner(KeyValue{Key: "r1", Value: []byte(goodRunner)}); err != nil || got.Stopped {
		t.Errorf("DecodeRunner(a record without stopped) = %+v, %v; want not stopped", got, err)
	}
	for _, bad := range []RunnerRecord{
		{ID: "r1", Incarnation: "i1", Weight: 1, Draining: true, Stopped: true},
		{ID: "r1", Incarnation: "i1", Stopped: true},
	} {
		if _, err := EncodeRunner(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("EncodeRunner(%+v) = %v, want ErrInvalidArgument", bad, err)
		}
	}
	for _, bad := range []string{
		`{"id":"r1","weight":1,"draining":true,"stopped":true,"incarnation":"i1","started":"2026-01-02T03:04:05Z"}`,
		`{"id":"r1","weight":0,"stopped":true,"incarnation":"i1","started":"2026-01-02T03:04:05Z"}`,
		`{"id":"r1","weight":0,"draining":true,"stopped":"yes","incarnation":"i1","started":"2026-01-02T03:04:05Z"}`,
	} {
		_, err := DecodeRunner(KeyValue{Key: "r1", Value: []byte(bad)})
		checkCorrupt(t, "DecodeRunner("+bad+")", err, KeyspaceRunners, "r1")
	}
}

// TestDecodersAreStrict: a value the library did not write (or that lost a
// required member) is corrupt, whatever encoding/json would make of it.
func TestDecodersAreStrict(t *testing.T) {
	if _, err := DecodeRunner(KeyValue{Key: "r1", Value: []byte(goodRunner)}); err != nil {
		t.Fatalf("DecodeRunner(good) = %v", err)
	}
	for _, bad := range []string{
		``, `null`, `{}`, `[]`, `"r1"`, `1`,
		`{"id":"r1","weight":1,"incarnation":"i1"}`,                                                    // no started
		`{"id":"r1","weight":1,"started":"2026-01-02T03:04:05Z"}`,                                      // no incarnation
		`{"id":"r1","incarnation":"i1","started":"2026-01-02T03:04:05Z"}`,                              // no weight
		`{"ID":"r1","weight":1,"incarnation":"i1","started":"2026-01-02T03:04:05Z"}`,                   // case variant
		`{"id":"r1","id":"r1","weight":1,"incarnation":"i1","started":"2026-01-02T03:04:05Z"}`,         // twice
		`{"id":"r1","weight":1.5,"incarnation":"i1","started":"2026-01-02T03:04:05Z"}`,                 // not an int
		`{"id":"r1","weight":-1,"incarnation":"i1","started":"2026-01-02T03:04:05Z"}`,                  // negative
		`{"id":"r1","weight":9223372036854775807,"incarnation":"i1","started":"2026-01-02T03:04:05Z"}`, // > MaxWeight
		`{"id":"r1","weight":"1","incarnation":"i1","started":"2026-01-02T03:04:05Z"}`,                 // string
		`{"id":"r1","weight":1,"incarnation":"i1","started":"yesterday"}`,                              // bad time
		`{"id":"r1","weight":1,"incarnation":"i1","started":"2026-01-02T03:04:05Z","address":"nowhere"}`,
		`{"id":"r1","weight":1,"incarnation":"i1","started":"2026-01-02T03:04:05Z","address":":7100"}`,
		`{"id":"r1","weight":1,"incarnation":"i1","started":"2026-01-02T03:04:05Z","leaseTTL":-1}`,
		`{"id":"r2","weight":1,"incarnation":"i1","started":"2026-01-02T03:04:05Z"}`, // names another runner
		`{"id":"r1","weight":1,"incarnation":"","started":"2026-01-02T03:04:05Z"}`,
		`{"id":"r1","weight":1,"incarnation":"i\u0001","started":"2026-01-02T03:04:05Z"}`,
		`{"id":"r1","weight":1,"incarnation":"i1","started":"2026-01-02T03:04:05Z"}x`,
		`{"id":"r1","weight":1,"incarnation":"i1","started":"2026-01-02T03:04:05Z"}{}`,
		"{\"id\":\"r1\",\"weight\":1,\"incarnation\":\"i\xff\",\"started\":\"2026-01-02T03:04:05Z\"}",
	} {
		_, err := DecodeRunner(KeyValue{Key: "r1", Value: []byte(bad)})
		checkCorrupt(t, "DecodeRunner("+bad+")", err, KeyspaceRunners, "r1")
	}
	for _, key := range []string{"", "a/b", "a\x01", strings.Repeat("x", 129)} {
		_, err := DecodeRunner(KeyValue{Key: key, Value: []byte(strings.Replace(goodRunner, `"r1"`, `"`+key+`"`, 1))})
		checkCorrupt(t, "DecodeRunner(key "+key+")", err, KeyspaceRunners, key)
	}

	owner := `{"runnerID":"r1","incarnation":"i1"}`
	if l, err := DecodeLock(KeyValue{Key: "7", Value: []byte(owner), Lease: 3, ModRevision: 9}); err != nil || l != (Lock{Shard: 7, Owner: Owner{"r1", "i1"}, Lease: 3, Epoch: 9}) {
		t.Fatalf("DecodeLock(good) = %+v, %v", l, err)
	}
	for _, bad := range []string{``, `null`, `{}`, `{"runnerID":"r1"}`, `{"runnerID":"","incarnation":"i1"}`, `{"runnerID":"a/b","incarnation":"i1"}`,
		`{"runnerid":"r1","incarnation":"i1"}`, `{"runnerID":7,"incarnation":"i1"}`, owner + `,`} {
		l, err := DecodeLock(KeyValue{Key: "7", Value: []byte(bad), Lease: 3, ModRevision: 9})
		checkCorrupt(t, "DecodeLock("+bad+")", err, KeyspaceShards, "7")
		if l.Shard != 7 || l.Lease != 3 || l.Epoch != 9 {
			t.Errorf("DecodeLock(%s) = %+v, want shard, lease and epoch kept", bad, l)
		}
	}
	for _, key := range []string{"07", "+7", "-1", "abc", "", "7 "} {
		l, err := DecodeLock(KeyValue{Key: key, Value: []byte(owner), Lease: 3, ModRevision: 9})
		checkCorrupt(t, "DecodeLock(key "+key+")", err, KeyspaceShards, key)
		if l != (Lock{}) {
			t.Errorf("DecodeLock(key %q) = %+v, want a zero Lock", key, l)
		}
	}

	ho := `{"from":"a","to":"b","phase":"ready"}`
	if h, err := DecodeHandoff("a", KeyValue{Key: "4", Value: []byte(ho)}); err != nil || h.Phase != HandoffReady {
		t.Fatalf("DecodeHandoff(good) = %+v, %v", h, err)
	}
	for _, bad := range []string{`null`, `{}`, `{"from":"a","to":"b"}`, `{"from":"a","to":"b","phase":"done"}`,
		`{"from":"a","to":"b","phase":"ready","fromEpoch":-1}`, `{"from":"a","to":"","phase":"ready"}`} {
		_, err := DecodeHandoff("a", KeyValue{Key: "4", Value: []byte(bad)})
		checkCorrupt(t, "DecodeHandoff("+bad+")", err, HandoffsFrom("a"), "4")
	}
	// A record under another old owner's prefix than the one it names.
	_, err := DecodeHandoff("x", KeyValue{Key: "4", Value: []byte(ho)})
	checkCorrupt(t, "DecodeHandoff(under handoffs/x)", err, HandoffsFrom("x"), "4")
	// Members a later version may add are ignored.
	if _, err := DecodeHandoff("a", KeyValue{Key: "4", Value: []byte(`{"from":"a","to":"b","phase":"ready","newField":[1]}`)}); err != nil {
		t.Errorf("DecodeHandoff(unknown member) = %v, want it ignored", err)
	}
}

// FuzzDecodeRunner: decoding never panics; an error is a *CorruptError
// naming the key; a decoded record encodes and decodes to itself; an
// encodable record decodes to itself.
func FuzzDecodeRunner(f *testing.F) {
	f.Add("r1", []byte(goodRunner), "r1", "10.0.0.5:7100", 1, "i1", int64(1767323045), int64(6), false, int64(15e9))
	f.Add("r1", []byte(`{}`), "r", "", 0, "x", int64(0), int64(0), true, int64(0))
	f.Add("a/b", []byte(`null`), "a\x01", "[::1]:80", -1, "", int64(-62135596800), int64(0), false, int64(-1))
	f.Fuzz(func(t *testing.T, key string, value []byte, id, addr string, weight int, inc string, sec, nsec int64, draining bool, ttl int64) {
		r, err := DecodeRunner(KeyValue{Key: key, Value: value})
		if err != nil {
			checkCorrupt(t, "DecodeRunner", err, KeyspaceRunners, key)
		} else {
			b, err := EncodeRunner(r.RunnerRecord)
			if err != nil {
				t.Fatalf("EncodeRunner(decoded %+v) = %v", r.RunnerRecord, err)
			}
			r2, err := DecodeRunner(KeyValue{Key: key, Value: b})
			if err != nil || !sameRunner(r2.RunnerRecord, r.RunnerRecord) {
				t.Fatalf("round trip of %+v = %+v, %v", r.RunnerRecord, r2.RunnerRecord, err)
			}
		}
		rec := RunnerRecord{ID: id, Address: addr, Weight: weight, Incarnation: inc, Started: time.Unix(sec, nsec).UTC(), Draining: draining, LeaseTTL: time.Duration(ttl)}
		if b, err := EncodeRunner(rec); err == nil {
			got, err := DecodeRunner(KeyValue{Key: id, Value: b})
			if err != nil || !sameRunner(got.RunnerRecord, rec) {
				t.Fatalf("DecodeRunner(EncodeRunner(%+v)) = %+v, %v", rec, got.RunnerRecord, err)
			}
		}
	})
}

// FuzzDecodeLock: as FuzzDecodeRunner, for lock keys and owners; a key that
// parses is canonical.
func FuzzDecodeLock(f *testing.F) {
	f.Add("7", []byte(`{"runnerID":"r1","incarnation":"i1"}`), int64(3), int64(9), "r1", "i1", uint32(7))
	f.Add("07", []byte(`null`), int64(0), int64(0), "", "", uint32(0))
	f.Fuzz(func(t *testing.T, key string, value []byte, lease, rev int64, runnerID, inc string, shard uint32) {
		l, err := DecodeLock(KeyValue{Key: key, Value: value, Lease: LeaseID(lease), ModRevision: Revision(rev)})
		if err != nil {
			checkCorrupt(t, "DecodeLock", err, KeyspaceShards, key)
		}
		if _, perr := sharding.ParseShardID(key); perr == nil {
			if l.Shard.String() != key || l.Lease != LeaseID(lease) || l.Epoch != Epoch(rev) {
				t.Fatalf("DecodeLock(%q) = %+v, want its shard, lease and epoch", key, l)
			}
		} else if l != (Lock{}) {
			t.Fatalf("DecodeLock(bad key %q) = %+v, want a zero lock", key, l)
		}
		if err == nil {
			b, err := EncodeOwner(l.Owner)
			if err != nil {
				t.Fatalf("EncodeOwner(decoded %+v) = %v", l.Owner, err)
			}
			if l2, err := DecodeLock(KeyValue{Key: key, Value: b, Lease: LeaseID(lease), ModRevision: Revision(rev)}); err != nil || l2 != l {
				t.Fatalf("round trip of %+v = %+v, %v", l, l2, err)
			}
		}
		o := Owner{RunnerID: runnerID, Incarnation: inc}
		if b, err := EncodeOwner(o); err == nil {
			k := sharding.ShardID(shard).String()
			got, err := DecodeLock(KeyValue{Key: k, Value: b, Lease: 1, ModRevision: 2})
			if err != nil || got != (Lock{Shard: sharding.ShardID(shard), Owner: o, Lease: 1, Epoch: 2}) {
				t.Fatalf("DecodeLock(%s, EncodeOwner(%+v)) = %+v, %v", k, o, got, err)
			}
		}
	})
}

// FuzzDecodeHandoff: as FuzzDecodeRunner, for handoff records.
func FuzzDecodeHandoff(f *testing.F) {
	f.Add("4", []byte(`{"from":"a","to":"b","phase":"ready","toIncarnation":"i","fromEpoch":12}`), "a", "b", "warming", "i", int64(12), uint32(4))
	f.Add("04", []byte(`{}`), "", "b", "x", "", int64(-1), uint32(0))
	f.Fuzz(func(t *testing.T, key string, value []byte, from, to, phase, toInc string, fromEpoch int64, shard uint32) {
		h, err := DecodeHandoff("a", KeyValue{Key: key, Value: value, Lease: 5, ModRevision: 6})
		if err != nil {
			checkCorrupt(t, "DecodeHandoff", err, HandoffsFrom("a"), key)
		} else {
			b, err := EncodeHandoff(h.HandoffRecord)
			if err != nil {
				t.Fatalf("EncodeHandoff(decoded %+v) = %v", h.HandoffRecord, err)
			}
			if h2, err := DecodeHandoff("a", KeyValue{Key: key, Value: b, Lease: 5, ModRevision: 6}); err != nil || h2 != h {
				t.Fatalf("round trip of %+v = %+v, %v", h, h2, err)
			}
		}
		rec := HandoffRecord{From: from, To: to, Phase: HandoffPhase(phase), ToIncarnation: toInc, FromEpoch: Epoch(fromEpoch)}
		if b, err := EncodeHandoff(rec); err == nil {
			k := sharding.ShardID(shard).String()
			got, err := DecodeHandoff(from, KeyValue{Key: k, Value: b})
			if err != nil || got.HandoffRecord != rec || got.Shard != sharding.ShardID(shard) {
				t.Fatalf("DecodeHandoff(EncodeHandoff(%+v)) = %+v, %v", rec, got, err)
			}
		}
	})
}

// FuzzDecodeCheckpoint: decoding never panics; an error is a *CorruptError
// naming the checkpoint's key; every checkpoint written at a positive epoch
// decodes to itself.
func FuzzDecodeCheckpoint(f *testing.F) {
	f.Add([]byte(`{"epoch":5,"data":"aGk="}`), "", int64(5), []byte("hi"), uint32(3))
	f.Add([]byte(`null`), "counter/1", int64(-5), []byte(nil), uint32(0))
	f.Add([]byte(`{}`), "a b", int64(0), []byte{}, uint32(1))
	f.Fuzz(func(t *testing.T, value []byte, name string, epoch int64, data []byte, shard uint32) {
		id := sharding.ShardID(shard)
		cp, err := DecodeCheckpoint(id, name, value, 7)
		if err != nil {
			checkCorrupt(t, "DecodeCheckpoint", err, "checkpoints", strings.TrimPrefix(CheckpointKey(id, name), "checkpoints/"))
		} else {
			if cp.Epoch <= 0 || cp.Revision != 7 {
				t.Fatalf("DecodeCheckpoint(%q) = %+v, want a positive epoch and revision 7", value, cp)
			}
			cp2, err := DecodeCheckpoint(id, name, EncodeCheckpoint(cp.Epoch, cp.Data), 7)
			if err != nil || cp2.Epoch != cp.Epoch || string(cp2.Data) != string(cp.Data) {
				t.Fatalf("round trip of %+v = %+v, %v", cp, cp2, err)
			}
		}
		if epoch > 0 {
			cp, err := DecodeCheckpoint(id, name, EncodeCheckpoint(Epoch(epoch), data), 7)
			if err != nil || cp.Epoch != Epoch(epoch) || string(cp.Data) != string(data) {
				t.Fatalf("DecodeCheckpoint(EncodeCheckpoint(%d, %q)) = %+v, %v", epoch, data, cp, err)
			}
		}
	})
}

// TestDecodeNotice: a notice decodes strictly: a moved notice needs the
// new owner's incarnation, an unknown kind or a bad key is corrupt, and
// members a later version may add are ignored.
func TestDecodeNotice(t *testing.T) {
	ks := NoticesTo("b")
	n, err := DecodeNotice(ks, KeyValue{Key: "7", Value: []byte(`{"kind":"moved","from":"a","incarnation":"i2"}`), Lease: 3, ModRevision: 40})
	if err != nil || n.Shard != 7 || n.Kind != NoticeMoved || n.From != "a" || n.Incarnation != "i2" || n.ModRevision != 40 || n.Lease != 3 {
		t.Fatalf("DecodeNotice(moved) = %+v, %v", n, err)
	}
	if n, err := DecodeNotice(ks, KeyValue{Key: "7", Value: []byte(`{"kind":"released","extra":{}}`)}); err != nil || n.Kind != NoticeReleased {
		t.Fatalf("DecodeNotice(released) = %+v, %v", n, err)
	}
	for _, bad := range []string{`null`, `{}`, `{"kind":"moved"}`, `{"kind":"gone"}`, `{"kind":"released","from":"a/b"}`, `{"kind":"released"} x`} {
		_, err := DecodeNotice(ks, KeyValue{Key: "7", Value: []byte(bad)})
		checkCorrupt(t, "DecodeNotice("+bad+")", err, ks, "7")
	}
	_, err = DecodeNotice(ks, KeyValue{Key: "07", Value: []byte(`{"kind":"released"}`)})
	checkCorrupt(t, "DecodeNotice(key 07)", err, ks, "07")
}

// FuzzDecodeNotice: as FuzzDecodeRunner, for notices.
func FuzzDecodeNotice(f *testing.F) {
	f.Add("4", []byte(`{"kind":"moved","from":"a","incarnation":"i"}`), "moved", "a", "i", uint32(4))
	f.Add("04", []byte(`{"kind":"released"}`), "released", "", "", uint32(0))
	ks := NoticesTo("b")
	f.Fuzz(func(t *testing.T, key string, value []byte, kind, from, inc string, shard uint32) {
		n, err := DecodeNotice(ks, KeyValue{Key: key, Value: value, Lease: 5, ModRevision: 6})
		if err != nil {
			checkCorrupt(t, "DecodeNotice", err, ks, key)
		} else {
			b, err := EncodeNotice(n.NoticeRecord)
			if err != nil {
				t.Fatalf("EncodeNotice(decoded %+v) = %v", n.NoticeRecord, err)
			}
			if n2, err := DecodeNotice(ks, KeyValue{Key: key, Value: b, Lease: 5, ModRevision: 6}); err != nil || n2 != n {
				t.Fatalf("round trip of %+v = %+v, %v", n, n2, err)
			}
		}
		rec := NoticeRecord{Kind: NoticeKind(kind), From: from, Incarnation: inc}
		if b, err := EncodeNotice(rec); err == nil {
			got, err := DecodeNotice(ks, KeyValue{Key: sharding.ShardID(shard).String(), Value: b})
			if err != nil || got.NoticeRecord != rec || got.Shard != sharding.ShardID(shard) {
				t.Fatalf("DecodeNotice(EncodeNotice(%+v)) = %+v, %v", rec, got, err)
			}
		}
	})
}
