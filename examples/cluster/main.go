// Command cluster is one process of a real multi-process shardhost
// cluster: a hosting runner or a gateway, each serving the runner debug
// page, its health checks and its metrics. run.sh (make demo-cluster)
// starts ./bin/etcd, three runners and a gateway that sends traffic; kill
// one with kill -9 and watch its shards move on the dashboards and in
// `shardhostctl status`. deploy/kubernetes and deploy/systemd run it as a
// service.
//
//	cluster -role runner  -id runner-1 -listen 127.0.0.1:7101 -debug 127.0.0.1:8081
//	cluster -role gateway -id gateway  -debug 127.0.0.1:8080 -api 127.0.0.1:8000
//
// The -debug address serves the debug page (DebugPath), liveness
// (LivenessPath: runner.LivenessHandler), readiness (ReadinessPath:
// runner.ReadinessHandler) and the runner's metrics in Prometheus's text
// format (MetricsPath). A gateway with -api serves POST /counters/{id}/inc
// (apiHandler).
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
// gracefully (a runner hands its shards off first) within
// -shutdown-timeout; SIGKILL is a crash. The exit status is 0 after a
// graceful stop, 2 for a bad command line, 3 (exitConflict) when another
// live process holds the runner's ID or its settings differ from the
// cluster's — a restart cannot help, an operator must act — and 1
// otherwise.
package main

import (
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

// Where every process serves on its -debug address.
const (
	DebugPath     = "/debug/shardhost/"
	LivenessPath  = "/livez"   // runner.LivenessHandler
	ReadinessPath = "/readyz"  // runner.ReadinessHandler
	MetricsPath   = "/metrics" // the runner's metrics, Prometheus text format
)

// exitConflict is the exit status of a runner whose ID another live
// process holds (runner.ErrDuplicateRunnerID) or whose settings differ
// from the cluster record's (runner.ErrClusterMismatch): restarting it
// cannot help (systemd: RestartPreventExitStatus).
const exitConflict = 3

// config is the command line.
type config struct {
	role      string
	id        string
	endpoints string
	namespace string
	listen    string
	debug     string
	debugURL  string // published in the runner record
	address   string // runner.Config.Address
	api       string // gateway: the HTTP API's address
	shards    int
	ttl       time.Duration
	handoff   time.Duration // runner.Config.ShutdownHandoffTimeout
	drain     time.Duration // runner.Config.DrainTimeout
	stop      time.Duration // Shutdown's deadline (0: stopBound)
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
	fs.StringVar(&c.address, "address", "", "runners: the transport `host:port` the other processes dial, published in the runner record (default: the -listen address)")
	fs.StringVar(&c.api, "api", "", "gateway: `address` of the HTTP API (POST /counters/{id}/inc; default: none)")
	fs.IntVar(&c.shards, "shards", runner.DefaultNumShards, "NumShards (the same on every process)")
	fs.DurationVar(&c.ttl, "ttl", 5*time.Second, "runners' lease TTL: a killed runner's shards move after about this")
	fs.DurationVar(&c.handoff, "handoff-timeout", defaultHandoffTimeout, "runner.Config.ShutdownHandoffTimeout: how long a stopping runner lets its peers take its shards by handoff")
	fs.DurationVar(&c.drain, "drain-timeout", runner.DefaultDrainTimeout, "runner.Config.DrainTimeout: a shard's handlers' drain before it moves")
	fs.DurationVar(&c.stop, "shutdown-timeout", 0, "Shutdown's deadline after SIGTERM (default: -handoff-timeout + -drain-timeout + 2 OpTimeout); the process exits within exitMargin after it")
	fs.Float64Var(&c.rate, "rate", 500, "gateway: asks per second of its own traffic, each on its own goroutine (0: none)")
	fs.Float64Var(&c.relay, "relay-ratio", 0.1, "gateway: the share of asks that are relays: counter A asks counter B, on another runner, from its handler (0 to 1)")
	fs.IntVar(&c.entities, "entities", 5000, "gateway: counters addressed")
	fs.DurationVar(&c.report, "report", 2*time.Second, "gateway: interval of the traffic line")
	fs.BoolVar(&c.verbose, "v", false, "info logs of the runner and warnings of the etcd client")
	c.traces.register(fs)
	c.security.register(fs)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.role != "runner" && c.role != "gateway" {
		return c, fmt.Errorf("-role %q: want runner or gateway", c.role)
	}
	if c.id == "" {
		c.id = c.role
	}
	if c.rate < 0 || c.entities <= 0 {
		return c, errors.New("-rate must not be negative, -entities must be positive")
	}
	if c.api != "" && c.role != "gateway" {
		return c, errors.New("-api: gateways only")
	}
	if c.handoff <= 0 || c.drain <= 0 || c.stop < 0 {
		return c, errors.New("-handoff-timeout and -drain-timeout must be positive, -shutdown-timeout not negative")
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
		if errors.Is(err, runner.ErrDuplicateRunnerID) || errors.Is(err, runner.ErrClusterMismatch) {
			os.Exit(exitConflict)
		}
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
	// The debug page, health checks and metrics, on their own port; the
	// page's URL goes into the runner record.
	lis, err := net.Listen("tcp", c.debug)
	if err != nil {
		return fmt.Errorf("debug page: %w", err)
	}
	defer lis.Close()
	var apiLis net.Listener
	if c.api != "" {
		if apiLis, err = net.Listen("tcp", c.api); err != nil {
			return fmt.Errorf("api: %w", err)
		}
		defer apiLis.Close()
	}
	cfg, err := c.runnerConfig(lis.Addr().String(), log)
	if err != nil {
		return err
	}
	mp, meters, metricsHandler, err := prometheusMetrics(c.id)
	if err != nil {
		return err
	}
	defer mp.Shutdown(context.Background())
	cfg.MeterProvider = meters
	flushTraces, err := c.traces.setup(ctx, &cfg)
	if err != nil {
		return err
	}
	defer func() {
		fctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
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
	mux.Handle(LivenessPath, r.LivenessHandler())
	mux.Handle(ReadinessPath, r.ReadinessHandler())
	mux.Handle(MetricsPath, metricsHandler)
	mux.Handle("/{$}", http.RedirectHandler(DebugPath, http.StatusFound))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 2)
	go func() { served <- srv.Serve(lis) }()
	fmt.Printf("%s (%s): debug page http://%s%s\n", c.id, c.role, lis.Addr(), DebugPath)
	var api *http.Server
	if apiLis != nil {
		api = &http.Server{Handler: apiHandler(r), ReadHeaderTimeout: 5 * time.Second}
		go func() { served <- api.Serve(apiLis) }()
		fmt.Printf("%s (%s): api http://%s\n", c.id, c.role, apiLis.Addr())
	}

	ran := make(chan error, 1)
	go func() { ran <- r.Run(context.Background()) }()
	var traffic *traffic
	if c.role == "gateway" && c.rate > 0 {
		traffic = startTraffic(r, c.rate, c.relay, c.entities, c.report, os.Stdout)
	}

	select {
	case <-ctx.Done():
	case err := <-ran:
		return fmt.Errorf("runner stopped: %w", err)
	case err := <-served:
		r.Close()
		return fmt.Errorf("debug page or api: %w", err)
	}
	stopIn := c.stopTimeout(r.Config())
	fmt.Printf("%s: stopping gracefully (within %v)\n", c.id, stopIn)
	sctx, cancel := context.WithTimeout(context.Background(), stopIn)
	defer cancel()
	if traffic != nil {
		traffic.stop()
	}
	if api != nil {
		_ = api.Shutdown(sctx) // the asks in flight finish
	}
	err = r.Shutdown(sctx) // hands the shards off, releases, revokes the lease
	<-ran
	// The health checks answer until Shutdown has returned (not ready).
	hctx, hcancel := context.WithTimeout(context.Background(), serverStopTimeout)
	defer hcancel()
	_ = srv.Shutdown(hctx)
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	fmt.Printf("%s: stopped\n", c.id)
	return nil
}
