package storage

import (
	"testing"
	"time"
)

func BenchmarkDecodeReminder(b *testing.B) {
	r := Reminder{Shard: 3, Entity: EntityRef{Kind: "bench", ID: "b12345"}, Name: "r", Method: "tick", First: time.Now().UTC(), Period: time.Hour, Epoch: 7}
	v, _ := EncodeReminder(r)
	kv := KeyValue{Key: "3/bench%2Fb12345/r", Value: v, ModRevision: 9}
	for b.Loop() {
		if _, err := DecodeReminder(kv); err != nil {
			b.Fatal(err)
		}
	}
}
