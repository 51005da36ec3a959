package etcd_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
	"github.com/shardhost/shardhost/storage/storagetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := stopSecureEtcd(); err != nil {
		fmt.Fprintln(os.Stderr, "stop the shared etcd:", err)
		code = max(code, 1)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var namespaces atomic.Int64

func TestConformance(t *testing.T) {
	srv := testenv.StartEtcd(t)
	cli := srv.Client(t)
	storagetest.Run(t, storagetest.Harness{New: func(t *testing.T) storagetest.Instance {
		ns := fmt.Sprintf("conformance-%d", namespaces.Add(1))
		s, err := etcd.New(cli, ns, etcd.Config{})
		if err != nil {
			t.Fatal(err)
		}
		prefix := "/" + ns + "/"
		return storagetest.Instance{
			Store: s,
			RawPut: func(ctx context.Context, key string, value []byte, lease storage.LeaseID) error {
				_, err := cli.Put(ctx, prefix+key, string(value), clientv3.WithLease(clientv3.LeaseID(lease)))
				return err
			},
			RawRevision: func(ctx context.Context, key string) (storage.Revision, bool, error) {
				resp, err := cli.Get(ctx, prefix+key)
				if err != nil || len(resp.Kvs) == 0 {
					return 0, false, err
				}
				return storage.Revision(resp.Kvs[0].ModRevision), true, nil
			},
			RawDelete: func(ctx context.Context, key string) error {
				_, err := cli.Delete(ctx, prefix+key)
				return err
			},
			Compact: func(ctx context.Context, rev storage.Revision) error {
				_, err := cli.Compact(ctx, int64(rev), clientv3.WithCompactPhysical())
				return err
			},
		}
	}})
}

func TestNewValidates(t *testing.T) {
	for _, ns := range []string{"", "a/b"} {
		if _, err := etcd.New(&clientv3.Client{}, ns, etcd.Config{}); err == nil {
			t.Errorf("New(namespace %q) succeeded", ns)
		}
	}
	if _, err := etcd.New(nil, "x", etcd.Config{}); err == nil {
		t.Error("New(nil client) succeeded")
	}
}
