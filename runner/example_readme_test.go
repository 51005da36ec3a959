package runner_test

// The README's "Using it" is this file after its package clause, with
// Example_cluster as func main (TestREADMEQuotesTheExample keeps them
// equal). It compiles with the package's tests; it does not run (it needs
// an etcd at 127.0.0.1:2379).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log"
	"os"
	"time"

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
	cli, err := etcd.NewClient(etcd.ClientConfig([]string{"127.0.0.1:2379"}))
	if err != nil {
		log.Fatal(err) // names the cause: a refused connection, a TLS mismatch, a wrong password
	}
	defer cli.Close()
	store, err := etcd.New(cli, "shop", etcd.Config{}) // keys under /shop/
	if err != nil {
		log.Fatal(err)
	}

	// A hosting runner (one per process). Every runner of the cluster uses
	// the same NumShards; other runners reach this one at Address, over
	// mutual TLS: New refuses a transport beyond loopback without TLS
	// unless Config.AllowInsecureTransport says so.
	srvTLS, peerTLS, err := transportTLS("ca.pem", "runner-1.pem", "runner-1-key.pem")
	if err != nil {
		log.Fatal(err)
	}
	r, err := runner.New(store, runner.Config{
		ID: "runner-1", NumShards: 1024, ListenAddr: ":7100", Address: "10.0.0.5:7100",
		TLS: srvTLS, PeerTLS: peerTLS,
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
	gw, err := runner.New(store, runner.Config{ID: "gateway-1", NumShards: 1024, ClientOnly: true,
		PeerTLS: peerTLS}) // in its own process: a certificate of its own
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

// transportTLS loads a runner's certificate (naming the host of its
// Address: IP 10.0.0.5 here) and the cluster's CA: the server requires a
// certificate of that CA from every peer, and the runner presents its own.
func transportTLS(caFile, certFile, keyFile string) (server, peer *tls.Config, err error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, nil, err
	}
	ca := x509.NewCertPool()
	if !ca.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("%s: no PEM certificate", caFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, err
	}
	server = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
	peer = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca, MinVersion: tls.VersionTLS13}
	return server, peer, nil
}
