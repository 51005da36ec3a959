package memory_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
	"github.com/shardhost/shardhost/storage/storagetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	storagetest.Run(t, storagetest.Harness{New: func(t *testing.T) storagetest.Instance {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		return storagetest.Instance{
			Store: c.NewStore(t.Name()),
			RawPut: func(_ context.Context, key string, value []byte, lease storage.LeaseID) error {
				_, err := c.Put(key, value, lease)
				return err
			},
			RawDelete: func(_ context.Context, key string) error { c.Delete(key); return nil },
			Compact:   func(_ context.Context, rev storage.Revision) error { c.Compact(rev); return nil },
		}
	}})
}
