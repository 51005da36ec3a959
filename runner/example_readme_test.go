package runner_test

// The README's "Using it" is this file after its package clause, with
// Example_cluster as func main (TestREADMEQuotesTheExample keeps them
// equal). It compiles with the package's tests; it does not run (it needs
// an etcd at 127.0.0.1:2379).

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/etcd"
)

// Cart is an entity: plain state, one message at a time, no locks.
type Cart struct{ Items map[string]int }

// AddReq travels between runners through the kind's codec (JSON): exported
// fields only, or entity.Method panics at definition.
type AddReq struct {
	SKU string
	Qty int
}

func (c *Cart) Add(ctx context.Context, r AddReq) (int, error) {
	if c.Items == nil {
		c.Items = map[string]int{}
	}
	c.Items[r.SKU] += r.Qty
	return len(c.Items), nil
}

var (
	CartKind = entity.NewKind("cart", func(id string) *Cart { return &Cart{} })
	AddItem  = entity.Method(CartKind, "add", (*Cart).Add)
)

func Example_cluster() {
	cli, err := clientv3.New(etcd.ClientConfig([]string{"127.0.0.1:2379"}))
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	store, err := etcd.New(cli, "shop", etcd.Config{}) // keys under /shop/
	if err != nil {
		log.Fatal(err)
	}

	// A hosting runner (one per process). Every runner of the cluster uses
	// the same NumShards; other runners reach this one at Address.
	r, err := runner.New(store, runner.Config{
		ID: "runner-1", NumShards: 1024, ListenAddr: ":7100", Address: "10.0.0.5:7100",
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Register(CartKind); err != nil { // the same kinds on every runner
		log.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	select {
	case <-r.Ready(): // registered
	case err := <-errc: // e.g. a NumShards that differs from the cluster's
		log.Fatal(err)
	}
	defer r.Shutdown(context.Background()) // hands shards off, releases the rest, revokes the lease

	// A gateway (usually a process of its own, e.g. the HTTP front end)
	// routes to the owners and hosts nothing.
	gw, err := runner.New(store, runner.Config{ID: "gateway-1", NumShards: 1024, ClientOnly: true})
	if err != nil {
		log.Fatal(err)
	}
	if err := gw.Register(CartKind); err != nil {
		log.Fatal(err)
	}
	go gw.Run(context.Background()) // sends made before Run has started wait for it
	defer gw.Shutdown(context.Background())

	// Later, e.g. in a request handler: routed to the owner of the cart's
	// shard, wherever it is; retried while no runner owns it yet.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n, err := AddItem.Ask(ctx, gw, "cart-42", AddReq{SKU: "book", Qty: 1})
	fmt.Println(n, err)
}
