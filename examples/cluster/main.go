// Command cluster is one process of a real multi-process shardhost
// cluster: a hosting runner or a gateway, each serving the runner debug
// page. run.sh (make demo-cluster) starts ./bin/etcd, three runners and a
// gateway that sends traffic; kill one with kill -9 and watch its shards
// move on the dashboards and in `shardhostctl status`.
//
//	cluster -role runner  -id runner-1 -listen 127.0.0.1:7101 -debug 127.0.0.1:8081
//	cluster -role gateway -id gateway  -debug 127.0.0.1:8080
//
// With -traces FILE a process exports its OpenTelemetry spans to FILE,
// one JSON span a line, with -trace-exporter otlp to an OTLP collector
// ($OTEL_EXPORTER_OTLP_ENDPOINT); -trace-ratio of the gateway's asks are
// traced. An ask is one trace across the gateway and the runner that
// served it; a relay (-relay-ratio of the asks) one across the gateway and
// two runners. cluster/waterfall draws one trace of the files as a picture.
//
// A runner hosts counter entities; the gateway is a client-only runner
// that routes asks to their owners (a -relay-ratio share of them relays:
// a counter asks a counter on another runner from its handler) and prints
// a line of traffic statistics every -report interval. Each runner
// publishes the URL of its debug page in its runner record
// (runner.Config.DebugURL), so every page shows every runner's own state,
// and a runner whose process died as unreachable. SIGINT or SIGTERM stops a process
// gracefully (a runner hands its shards off first); SIGKILL is a crash.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/etcd"
)

// DebugPath is where every process serves the runner debug handler.
const DebugPath = "/debug/shardhost/"

// config is the command line.
type config struct {
	role      string
	id        string
	endpoints string
	namespace string
	listen    string
	debug     string
	debugURL  string // published in the runner record
	shards    int
	ttl       time.Duration
	rate      float64
	relay     float64
	entities  int
	report    time.Duration
	verbose   bool
	security  security // TLS and authentication (secure.go)
	traces    traces   // OpenTelemetry traces (tracing.go)
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	fs.StringVar(&c.role, "role", "runner", "`runner` (hosts shards) or gateway (routes and sends traffic)")
	fs.StringVar(&c.id, "id", "", "runner ID (default: the role)")
	fs.StringVar(&c.endpoints, "etcd", "127.0.0.1:2379", "etcd `host:port`s, comma-separated")
	fs.StringVar(&c.namespace, "namespace", "demo", "the cluster's namespace in etcd")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:0", "runner transport `address` (runners only; beyond loopback it needs -tls-ca, -tls-cert and -tls-key)")
	fs.StringVar(&c.debug, "debug", "127.0.0.1:8080", "`address` of the debug page (http://ADDRESS"+DebugPath+")")
	fs.StringVar(&c.debugURL, "debug-url", "", "the debug page's `URL` as the other processes reach it, published in the runner record (default http://ADDRESS"+DebugPath+" of -debug)")
	fs.IntVar(&c.shards, "shards", runner.DefaultNumShards, "NumShards (the same on every process)")
	fs.DurationVar(&c.ttl, "ttl", 5*time.Second, "runners' lease TTL: a killed runner's shards move after about this")
	fs.Float64Var(&c.rate, "rate", 500, "gateway: asks per second, each on its own goroutine")
	fs.Float64Var(&c.relay, "relay-ratio", 0.1, "gateway: the share of asks that are relays: counter A asks counter B, on another runner, from its handler (0 to 1)")
	fs.IntVar(&c.entities, "entities", 5000, "gateway: counters addressed")
	fs.DurationVar(&c.report, "report", 2*time.Second, "gateway: interval of the traffic line")
	fs.BoolVar(&c.verbose, "v", false, "info logs of the runner and warnings of the etcd client")
	c.traces.register(fs)
	c.security.register(fs)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.role != "runner" && c.role != "gateway" {
		return c, fmt.Errorf("-role %q: want runner or gateway", c.role)
	}
	if c.id == "" {
		c.id = c.role
	}
	if c.rate <= 0 || c.entities <= 0 {
		return c, errors.New("-rate and -entities must be positive")
	}
	if c.relay < 0 || c.relay > 1 {
		return c, fmt.Errorf("-relay-ratio %v: want 0 to 1", c.relay)
	}
	if err := c.traces.check(); err != nil {
		return c, err
	}
	return c, nil
}

func main() {
	c, err := parseFlags(os.Args[1:])
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "cluster:", err)
		}
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintf(os.Stderr, "cluster %s: %v\n", c.id, err)
		os.Exit(1)
	}
}

// run runs one process until ctx ends, then stops it gracefully.
func run(ctx context.Context, c config) error {
	level := slog.LevelWarn
	if c.verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ccfg := etcd.ClientConfig(strings.Split(c.endpoints, ","))
	if !c.verbose {
		ccfg.Logger = zap.NewNop()
	}
	if err := c.security.etcdClient(&ccfg); err != nil {
		return err
	}
	cli, err := etcd.NewClient(ccfg) // logs in when a user is given; its error names the cause
	if err != nil {
		return err
	}
	defer cli.Close()
	store, err := etcd.New(cli, c.namespace, etcd.Config{})
	if err != nil {
		return err
	}
	// The debug page, on its own port; its URL goes into the runner record.
	lis, err := net.Listen("tcp", c.debug)
	if err != nil {
		return fmt.Errorf("debug page: %w", err)
	}
	defer lis.Close()
	cfg := runner.Config{ID: c.id, NumShards: c.shards, LeaseTTL: c.ttl, Logger: log}
	if c.role == "gateway" {
		cfg.ClientOnly = true
	} else {
		cfg.ListenAddr = c.listen
		cfg.DebugURL = cmp.Or(c.debugURL, "http://"+lis.Addr().String()+DebugPath)
	}
	if err := c.security.runnerTLS(&cfg); err != nil {
		return err
	}
	flushTraces, err := c.traces.setup(ctx, &cfg)
	if err != nil {
		return err
	}
	defer func() {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := flushTraces(fctx); err != nil {
			fmt.Fprintf(os.Stderr, "cluster %s: traces: %v\n", c.id, err)
		}
	}()
	r, err := runner.New(store, cfg)
	if err != nil {
		return err
	}
	if err := r.Register(CounterKind); err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle(DebugPath, r.DebugHandler(runner.DebugConfig{}))
	mux.Handle("/", http.RedirectHandler(DebugPath, http.StatusFound))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	fmt.Printf("%s (%s): debug page http://%s%s\n", c.id, c.role, lis.Addr(), DebugPath)

	ran := make(chan error, 1)
	go func() { ran <- r.Run(context.Background()) }()
	var traffic *traffic
	if c.role == "gateway" {
		traffic = startTraffic(r, c.rate, c.relay, c.entities, c.report, os.Stdout)
	}

	select {
	case <-ctx.Done():
	case err := <-ran:
		return fmt.Errorf("runner stopped: %v", err)
	case err := <-served:
		r.Close()
		return fmt.Errorf("debug page: %w", err)
	}
	fmt.Printf("%s: stopping gracefully\n", c.id)
	if traffic != nil {
		traffic.stop()
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Shutdown(sctx) // hands the shards off, releases, revokes the lease
	<-ran
	_ = srv.Shutdown(sctx)
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	fmt.Printf("%s: stopped\n", c.id)
	return nil
}
