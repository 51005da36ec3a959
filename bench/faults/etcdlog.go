package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
)

// observer records when this process saw each DELETE under a prefix (a
// lease expiring on the server deletes its keys in one revision): the
// revision's Mono instant, for the detach-before-expiry check. A watch that
// fails resumes after the last revision it delivered, so no deletion is
// missed; one seen late only makes its instant later.
type observer struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	deletes map[int64]int64 // revision -> Mono when seen
}

func startObserver(cli *clientv3.Client, prefix string) *observer {
	ctx, cancel := context.WithCancel(context.Background())
	o := &observer{cancel: cancel, done: make(chan struct{}), deletes: map[int64]int64{}}
	go func() {
		defer close(o.done)
		var last int64
		for ctx.Err() == nil {
			opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFilterPut()}
			if last > 0 {
				opts = append(opts, clientv3.WithRev(last+1))
			}
			for wr := range cli.Watch(clientv3.WithRequireLeader(ctx), prefix, opts...) {
				now := runnerproc.Mono()
				o.mu.Lock()
				for _, ev := range wr.Events {
					rev := ev.Kv.ModRevision
					last = max(last, rev)
					if _, ok := o.deletes[rev]; !ok {
						o.deletes[rev] = now
					}
				}
				o.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return o
}

func (o *observer) stop() {
	o.cancel()
	<-o.done
}

// seen returns when the DELETE at rev was seen (0: never).
func (o *observer) seen(rev int64) int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.deletes[rev]
}

// kvEvent is one change of a key, as etcd's history holds it.
type kvEvent struct {
	Rev       int64
	Put       bool
	Key       string // relative to the namespace prefix: "shards/7", "checkpoints/7/..."
	Value     []byte
	Lease     int64 // of the new value (puts)
	PrevLease int64 // of the value before (deletes)
}

// readBack reads the namespace's whole history from etcd (revision 1 up to
// now), in revision order: what the store accepted, independent of what
// the runners say.
func readBack(ctx context.Context, cli *clientv3.Client, prefix string) ([]kvEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, fmt.Errorf("read back: %w", err)
	}
	head := resp.Header.Revision
	var out []kvEvent
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(1), clientv3.WithPrevKV())
	// A progress notification (no events) comes once the watch has caught
	// up: it ends the read even if the last revision was not ours.
	_ = cli.RequestProgress(wctx)
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return nil, fmt.Errorf("read back: %w", err)
		}
		for _, ev := range wr.Events {
			e := kvEvent{Rev: ev.Kv.ModRevision, Put: ev.Type == mvccpb.PUT, Key: strings.TrimPrefix(string(ev.Kv.Key), prefix)}
			if e.Put {
				e.Value, e.Lease = ev.Kv.Value, ev.Kv.Lease
			} else if ev.PrevKv != nil {
				e.PrevLease = ev.PrevKv.Lease
			}
			out = append(out, e)
		}
		if (len(out) > 0 && out[len(out)-1].Rev >= head) || (wr.IsProgressNotify() && wr.Header.Revision >= head) {
			return out, nil
		}
		if len(wr.Events) == 0 {
			_ = cli.RequestProgress(wctx)
		}
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("read back: %w", ctx.Err())
	}
	return out, nil
}
