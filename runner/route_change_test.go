package runner_test

import (
	"context"
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// deadPort is what a crashed runner's address does to a dial: a
// black-holed one accepts and never answers (a dial hangs until gRPC's own
// connect timeout gives up and closes it); a refused one has no listener.
type deadPort struct {
	*testenv.Blackhole // nil: refused
	addr               string
}

// newDeadPort is a port a dial hangs on (black-holed) or is refused at.
func newDeadPort(t *testing.T, blackholed bool) *deadPort {
	t.Helper()
	if blackholed {
		b := testenv.StartBlackhole(t)
		return &deadPort{Blackhole: b, addr: b.Addr()}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	return &deadPort{addr: addr}
}

// TestRouteChangeCancelsDialToGoneRunner: the owner of a shard has
// crashed and its port is dead (black-holed: a dial hangs; or refused); a
// gateway's ask (ConnectTimeout of a minute) waits for a connection to it.
// The owner's lease ends: the route changes, the wait is abandoned
// (nothing was sent) and the ask is answered by the runner that takes the
// shard over — for the black-holed port before the pending dial to it has
// ended (it would hold the ask until gRPC's connect timeout closes it if
// the route change did not cancel the wait).
func TestRouteChangeCancelsDialToGoneRunner(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"black-holed", "refused"} {
		t.Run(mode, func(t *testing.T) {
			const shards = 4
			dead := newDeadPort(t, mode == "black-holed")
			c := startEtcdCluster(t)
			register := func(r *runner.Runner) error { return r.Register(whereKind) }
			// "gone" advertises the dead port; "next" is its successor. next
			// starts first: a move at the start goes from next to gone, so
			// only the gateway ever dials the dead port.
			next := c.startWith(runner.Config{ID: "next", NumShards: shards, ListenAddr: "127.0.0.1:0"}, register)
			gone := c.startWith(runner.Config{ID: "gone", NumShards: shards, ListenAddr: "127.0.0.1:0", Address: dead.addr}, register)
			gw := c.startWith(runner.Config{ID: "gateway", NumShards: shards, ClientOnly: true, ConnectTimeout: time.Minute}, register)
			c.waitPartition([]*etcdRunner{gone, next}, shards, 30*time.Second)

			var shard sharding.ShardID
			for id := range gone.Owned() {
				shard = id
				break
			}
			entity := idFor(shard, shards, "e")
			waitFor(t, 10*time.Second, "the gateway routes the shard to gone", func() bool {
				o, _ := gw.OwnerOf(shard)
				return o == "gone"
			})

			// gone crashes: its lease and locks stay until they expire (or
			// are revoked below), so the gateway still routes to it.
			lease := gone.Status().Lease
			gone.stop()

			type result struct {
				resp whereResp
				err  error
				at   time.Time
			}
			res := make(chan result, 1)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			go func() {
				resp, err := whereMethod.Ask(ctx, gw, entity, whereReq{})
				res <- result{resp, err, time.Now()}
			}()
			if dead.Blackhole != nil {
				select {
				case <-dead.Accepted(): // the ask's dial hangs
				case r := <-res:
					t.Fatalf("the ask ended before dialing the black hole: %+v", r)
				}
			}
			// gone's lease ends now rather than after its TTL: the route
			// changes (next takes the shard) while the dial still hangs.
			if _, err := c.direct.Revoke(ctx, clientv3.LeaseID(lease)); err != nil {
				t.Logf("revoke gone's lease: %v (it expires instead)", err)
			}
			r := <-res
			if r.err != nil {
				t.Fatalf("ask after gone's crash: %v", r.err)
			}
			if r.resp.Runner != "next" || r.resp.Shard != shard {
				t.Fatalf("ask answered by %q on shard %d, want next on %d", r.resp.Runner, r.resp.Shard, shard)
			}
			if dead.Blackhole != nil {
				select {
				case at := <-dead.Closed():
					if at.Before(r.at) {
						t.Fatalf("the ask was answered %v after the dial to the gone runner ended: the route change did not cancel the wait", r.at.Sub(at))
					}
				default:
				}
			}
			checkSingleOwner(t, c.rec.all())
		})
	}
}
