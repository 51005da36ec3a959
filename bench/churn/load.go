package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
)

// The ask load that runs through the churn.

// load is the callers' traffic.
type load struct {
	began   time.Time
	stop    chan struct{}
	wg      sync.WaitGroup
	recs    [][]askRec          // per caller
	samples []map[string]string // per caller: the first error of each class
}

func (h *harness) startLoad() *load {
	l := &load{began: time.Now(), stop: make(chan struct{}), recs: make([][]askRec, h.p.Callers), samples: make([]map[string]string, h.p.Callers)}
	for g := range h.p.Callers {
		l.samples[g] = map[string]string{}
		l.wg.Go(func() {
			for i := g; ; i += h.p.Callers {
				select {
				case <-l.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), askTimeout)
				t0 := time.Now()
				id := fmt.Sprintf("counter-%d", i%h.p.Entities)
				var err error
				if h.p.Procs { // the children host runnerproc's kind
					_, err = runnerproc.Echo.Ask(ctx, h.gw.r, id, runnerproc.EchoReq{})
				} else {
					_, err = incMethod.Ask(ctx, h.gw.r, id, incReq{})
				}
				rec := askRec{at: t0.Sub(l.began), dur: time.Since(t0)}
				cancel()
				if err != nil {
					c := classify(err)
					rec.class = int8(1 + slices.Index(classes, c))
					if _, ok := l.samples[g][c]; !ok {
						l.samples[g][c] = err.Error()
					}
				}
				l.recs[g] = append(l.recs[g], rec)
			}
		})
	}
	return l
}

// finish stops the callers (each ends its ask in flight, at most
// askTimeout) and returns every ask and a sample error per class.
func (l *load) finish() ([]askRec, map[string]string) {
	close(l.stop)
	l.wg.Wait()
	var all []askRec
	samples := map[string]string{}
	for g, r := range l.recs {
		all = append(all, r...)
		for c, msg := range l.samples[g] {
			if _, ok := samples[c]; !ok {
				samples[c] = msg
			}
		}
	}
	return all, samples
}
