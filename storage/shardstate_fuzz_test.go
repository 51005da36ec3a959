package storage

import (
	"errors"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
)

// FuzzDecodeReminder: decoding a reminder key never panics; an error is a
// *CorruptError naming the key; a decoded reminder encodes to a value that
// decodes to itself under the key it came from; an encodable reminder
// decodes to itself, and encoding any other fails with ErrInvalidArgument.
func FuzzDecodeReminder(f *testing.F) {
	f.Add("3/cart%2Fc1/expire", []byte(`{"method":"tick","first":1893456000000000000,"period":1000000000,"payload":"e30=","epoch":7}`), uint32(3), "cart", "c1", "expire", "tick", int64(1893456000000000000), int64(time.Second), true, []byte("{}"))
	f.Add("3/cart%2Fc1", []byte(`{"method":"tick","first":1,"epoch":1}`), uint32(1), "a/b", "", "", "", int64(0), int64(-1), false, []byte(nil))
	f.Add("03/k%2Fx/r", []byte(`{"method":"tick","first":1893456000000000000,"epoch":1,"epoch":2}`), uint32(0), "k", "x/y z", "r/s", "m", int64(-1), int64(1<<62), false, []byte("x"))
	f.Add("1/k%2Fx/r%zz", []byte(`null`), uint32(7), "\x00", "\xff", "\x01", "\x02", int64(1<<62), int64(0), true, []byte{})
	f.Fuzz(func(t *testing.T, key string, value []byte, shard uint32, kind, id, name, method string, first, period int64, skip bool, payload []byte) {
		r, err := DecodeReminder(KeyValue{Key: key, Value: value, ModRevision: 5})
		if err != nil {
			checkCorrupt(t, "DecodeReminder", err, KeyspaceReminders, key)
		} else {
			b, err := EncodeReminder(r)
			if err != nil {
				t.Fatalf("EncodeReminder(decoded %+v) = %v", r, err)
			}
			r2, err := DecodeReminder(KeyValue{Key: key, Value: b, ModRevision: 5})
			if err != nil || !sameReminder(r, r2) {
				t.Fatalf("round trip of %+v = %+v, %v", r, r2, err)
			}
		}
		in := Reminder{Shard: sharding.ShardID(shard), Entity: EntityRef{Kind: kind, ID: id}, Name: name, Method: method,
			First: time.Unix(0, first).UTC(), Period: time.Duration(period), Skip: skip, Payload: payload, Epoch: 9}
		b, err := EncodeReminder(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("EncodeReminder(%+v) = %v, want ErrInvalidArgument", in, err)
			}
			return
		}
		k := ReminderKey(in.Shard, in.Entity, in.Name)[len(KeyspaceReminders)+1:]
		got, err := DecodeReminder(KeyValue{Key: k, Value: b, ModRevision: 5})
		in.Revision = 5
		if err != nil || !sameReminder(got, in) {
			t.Fatalf("DecodeReminder(EncodeReminder(%+v)) = %+v, %v", in, got, err)
		}
	})
}

func sameReminder(a, b Reminder) bool {
	return a.Shard == b.Shard && a.Entity == b.Entity && a.Name == b.Name && a.Method == b.Method && a.First.Equal(b.First) &&
		a.Period == b.Period && a.Skip == b.Skip && string(a.Payload) == string(b.Payload) && a.Epoch == b.Epoch && a.Revision == b.Revision
}

// FuzzDecodeProgress: decoding a shard's reminder progress never panics;
// an error is a *CorruptError naming the key; a decoded progress encodes
// and decodes to itself; an encodable one decodes to itself.
func FuzzDecodeProgress(f *testing.F) {
	f.Add("4", []byte(`{"epoch":9,"final":true,"cut":1893456000000000000,"fired":[{"entity":"k%2Fx","name":"r","rev":3,"tick":12}]}`), int64(1893456000000000000), "k", "x", "r", int64(3), uint64(12))
	f.Add("4", []byte(`{"epoch":9,"final":false,"cut":1}`), int64(0), "", "", "", int64(0), uint64(0))
	f.Add("04", []byte(`{"epoch":9,"final":true,"cut":1893456000000000000,"fired":[{"entity":"nokind","name":"r","rev":3,"tick":1}]}`), int64(-1), "a/b", "c", "\x00", int64(-1), uint64(1<<63))
	f.Fuzz(func(t *testing.T, key string, value []byte, cut int64, kind, id, name string, rev int64, tick uint64) {
		p, err := DecodeProgress(KeyValue{Key: key, Value: value, ModRevision: 5})
		if err != nil {
			checkCorrupt(t, "DecodeProgress", err, KeyspaceReminders, key)
		} else {
			b, err := EncodeProgress(p)
			if err != nil {
				t.Fatalf("EncodeProgress(decoded %+v) = %v", p, err)
			}
			p2, err := DecodeProgress(KeyValue{Key: key, Value: b, ModRevision: 5})
			if err != nil || !sameProgress(p, p2) {
				t.Fatalf("round trip of %+v = %+v, %v", p, p2, err)
			}
		}
		in := ReminderProgress{Shard: 4, Epoch: 9, Final: true, Cut: time.Unix(0, cut).UTC(),
			Fired: []FiredTick{{Entity: EntityRef{Kind: kind, ID: id}, Name: name, Revision: Revision(rev), Tick: tick}}}
		b, err := EncodeProgress(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("EncodeProgress(%+v) = %v, want ErrInvalidArgument", in, err)
			}
			return
		}
		got, err := DecodeProgress(KeyValue{Key: "4", Value: b, ModRevision: 5})
		in.Revision = 5
		if err != nil || !sameProgress(got, in) {
			t.Fatalf("DecodeProgress(EncodeProgress(%+v)) = %+v, %v", in, got, err)
		}
	})
}

func sameProgress(a, b ReminderProgress) bool {
	return a.Shard == b.Shard && a.Epoch == b.Epoch && a.Final == b.Final && a.Cut.Equal(b.Cut) && a.Revision == b.Revision && slices.Equal(a.Fired, b.Fired)
}

// FuzzDecodeRemembered: decoding a remembered-entity key never panics; an
// error is a *CorruptError naming the key; an encodable entity decodes to
// itself under its own key.
func FuzzDecodeRemembered(f *testing.F) {
	f.Add("5/feed%2Ff1", []byte(`{"epoch":3}`), "feed", "f1")
	f.Add("5/feed", []byte(`{"epoch":3}`), "a/b", "")
	f.Add("5/feed%2Ff1/x", []byte(`{"epoch":0}`), "\x00", "\xff")
	f.Fuzz(func(t *testing.T, key string, value []byte, kind, id string) {
		r, err := DecodeRemembered(KeyValue{Key: key, Value: value, ModRevision: 5})
		if err != nil {
			checkCorrupt(t, "DecodeRemembered", err, KeyspaceRemembered, key)
		} else if RememberedKey(r.Shard, r.Entity) != string(KeyspaceRemembered)+"/"+key {
			t.Fatalf("DecodeRemembered(%q) = %+v, whose key is %s", key, r, RememberedKey(r.Shard, r.Entity))
		}
		in := RememberedEntity{Shard: 5, Entity: EntityRef{Kind: kind, ID: id}, Epoch: 3}
		b, err := EncodeRemembered(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("EncodeRemembered(%+v) = %v, want ErrInvalidArgument", in, err)
			}
			return
		}
		k := RememberedKey(5, in.Entity)[len(KeyspaceRemembered)+1:]
		got, err := DecodeRemembered(KeyValue{Key: k, Value: b, ModRevision: 5})
		in.Revision = 5
		if err != nil || got != in {
			t.Fatalf("DecodeRemembered(EncodeRemembered(%+v)) = %+v, %v (key %s, escaped %s)", in, got, err, k, url.PathEscape(kind))
		}
	})
}

// FuzzDecodeSingleton: decoding a singleton record never panics; an error
// is a *CorruptError naming the key; an encodable record decodes to
// itself under its own key.
func FuzzDecodeSingleton(f *testing.F) {
	f.Add("5/scheduler", []byte(`{"runner":"r1","started":1893456000000000000,"epoch":3}`), "scheduler", "r1", int64(1893456000000000000))
	f.Add("5/a%2Fb", []byte(`{"runner":"","started":1,"epoch":0}`), "a/b", "", int64(0))
	f.Add("05/x", []byte(`{"runner":"r/1","started":1,"epoch":1,"epoch":2}`), "\x00", "r/1", int64(-1))
	f.Fuzz(func(t *testing.T, key string, value []byte, name, runner string, started int64) {
		r, err := DecodeSingleton(KeyValue{Key: key, Value: value, ModRevision: 5})
		if err != nil {
			checkCorrupt(t, "DecodeSingleton", err, KeyspaceSingletons, key)
		} else if SingletonKey(r.Shard, r.Name) != string(KeyspaceSingletons)+"/"+key {
			t.Fatalf("DecodeSingleton(%q) = %+v, whose key is %s", key, r, SingletonKey(r.Shard, r.Name))
		}
		in := SingletonRecord{Shard: 5, Name: name, Runner: runner, Started: time.Unix(0, started).UTC(), Epoch: 3}
		b, err := EncodeSingleton(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("EncodeSingleton(%+v) = %v, want ErrInvalidArgument", in, err)
			}
			return
		}
		k := SingletonKey(5, name)[len(KeyspaceSingletons)+1:]
		got, err := DecodeSingleton(KeyValue{Key: k, Value: b, ModRevision: 5})
		in.Revision = 5
		if err != nil || got.Name != in.Name || got.Runner != in.Runner || !got.Started.Equal(in.Started) || got.Epoch != 3 || got.Shard != 5 || got.Revision != 5 {
			t.Fatalf("DecodeSingleton(EncodeSingleton(%+v)) = %+v, %v", in, got, err)
		}
	})
}
