package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// The ask load that runs through the churn: a client-only gateway, the
// callers that ask through it and the crash probes (probe.go). It runs in
// a child process of its own (loadproc.go) unless -loadproc=false.

// loadDriver is the gateway with its callers and probes, in this process
// (gatewayLoad) or in the load child (childLoad).
type loadDriver interface {
	// begin starts the callers and returns when they began.
	begin() (time.Time, error)
	// finish stops the callers (each ends its ask in flight, at most
	// askTimeout) and returns every ask and a sample error per class.
	finish() ([]askRec, map[string]string, error)
	// probe starts a crash's probers (probe.go): one per shard of owned,
	// which victim owned when it crashed at crashAt.
	probe(owned []sharding.ShardID, victim string, crashAt time.Time) (int, error)
	// probed waits for the probers started by probe (at most probeWait,
	// then stops them) and returns their results.
	probed(id int) ([]firstAsk, error)
	// pid is the process the load runs in (0: this one).
	pid() int
	// close closes the gateway (idempotent).
	close()
}

// loadSpec is what the load needs: where the cluster is and what to ask.
type loadSpec struct {
	Endpoint  string
	Namespace string
	Shards    int
	Callers   int
	Entities  int
	Procs     bool // the runners host runnerproc's kind: ask Echo
	Verbose   bool
}

// gatewayLoad is the load in this process.
type gatewayLoad struct {
	spec     loadSpec
	gw       *runner.Runner
	cli      *clientv3.Client
	ran      chan struct{} // closed when the gateway's Run returned
	l        *load
	probeIDs []string // an entity of each shard, by shard

	mu     sync.Mutex
	probes []*probes // by id
	closed sync.Once
}

// newGatewayLoad starts the gateway of spec; log is its logger.
func newGatewayLoad(spec loadSpec, log *slog.Logger) (*gatewayLoad, error) {
	r, cli, err := openRunner(spec.Endpoint, spec.Namespace, spec.Verbose, runner.Config{
		ID: "gateway", ClientOnly: true, NumShards: spec.Shards, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	g := &gatewayLoad{spec: spec, gw: r, cli: cli, ran: make(chan struct{}), probeIDs: probeEntities(spec.Shards)}
	go func() {
		defer close(g.ran)
		_ = r.Run(context.Background())
	}()
	return g, nil
}

func (g *gatewayLoad) pid() int { return 0 }

func (g *gatewayLoad) close() {
	g.closed.Do(func() {
		g.gw.Close()
		<-g.ran
		_ = g.cli.Close()
	})
}

// load is the callers' traffic.
type load struct {
	began   time.Time
	stop    chan struct{}
	wg      sync.WaitGroup
	recs    [][]askRec          // per caller
	samples []map[string]string // per caller: the first error of each class
}

func (g *gatewayLoad) begin() (time.Time, error) {
	n := g.spec.Callers
	l := &load{began: time.Now(), stop: make(chan struct{}), recs: make([][]askRec, n), samples: make([]map[string]string, n)}
	g.l = l
	for c := range n {
		l.samples[c] = map[string]string{}
		l.wg.Go(func() {
			for i := c; ; i += n {
				select {
				case <-l.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), askTimeout)
				t0 := time.Now()
				id := fmt.Sprintf("counter-%d", i%g.spec.Entities)
				var err error
				if g.spec.Procs { // the children host runnerproc's kind
					_, err = runnerproc.Echo.Ask(ctx, g.gw, id, runnerproc.EchoReq{})
				} else {
					_, err = incMethod.Ask(ctx, g.gw, id, incReq{})
				}
				rec := askRec{at: t0.Sub(l.began), dur: time.Since(t0)}
				cancel()
				if err != nil {
					cl := classify(err)
					rec.class = int8(1 + slices.Index(classes, cl))
					if _, ok := l.samples[c][cl]; !ok {
						l.samples[c][cl] = err.Error()
					}
				}
				l.recs[c] = append(l.recs[c], rec)
			}
		})
	}
	return l.began, nil
}

func (g *gatewayLoad) finish() ([]askRec, map[string]string, error) {
	l := g.l
	if l == nil {
		return nil, nil, nil
	}
	close(l.stop)
	l.wg.Wait()
	var all []askRec
	samples := map[string]string{}
	for c, r := range l.recs {
		all = append(all, r...)
		for cl, msg := range l.samples[c] {
			if _, ok := samples[cl]; !ok {
				samples[cl] = msg
			}
		}
	}
	return all, samples, nil
}
