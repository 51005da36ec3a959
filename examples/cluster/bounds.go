package main

import (
	"cmp"
	"log/slog"
	"time"

	"github.com/shardhost/shardhost/runner"
)

// How long a graceful stop takes, from which a supervisor's stop timeout
// follows (Kubernetes' terminationGracePeriodSeconds, systemd's
// TimeoutStopSec): preStop + stopBound + exitMargin. docs/deploying.md
// ("Stopping: grace periods") explains the terms; deploy_test.go checks
// deploy/'s manifests against them.

// defaultHandoffTimeout is -handoff-timeout's default,
// runner.Config.ShutdownHandoffTimeout's.
const defaultHandoffTimeout = 30 * time.Second

// Bounds of what a process does after Shutdown returned: the HTTP
// servers' stop, then the flush of its spans.
const (
	serverStopTimeout = 2 * time.Second
	traceFlushTimeout = 5 * time.Second
	// exitMargin bounds the time from Shutdown's return to the process's
	// exit.
	exitMargin = serverStopTimeout + traceFlushTimeout + time.Second
)

// stopBound is Shutdown's deadline T for these timeouts: with a deadline,
// Shutdown lets the handoffs run until T − min(OpTimeout, T/4) and keeps
// the rest for the plain release and the lease's revocation, so this T
// gives the handoffs at least handoff + drain + OpTimeout, and the release
// (one DrainTimeout and one OpTimeout per transaction) and revocation (one
// OpTimeout) their own bounds.
func stopBound(handoff, drain, op time.Duration) time.Duration {
	return handoff + drain + 2*op
}

// stopTimeout is the deadline this process gives Shutdown: -shutdown-timeout,
// or stopBound of cfg's timeouts (cfg with its defaults applied:
// runner.Runner.Config).
func (c config) stopTimeout(cfg runner.Config) time.Duration {
	return cmp.Or(c.stop, stopBound(cfg.ShutdownHandoffTimeout, cfg.DrainTimeout, cfg.OpTimeout))
}

// graceBound is the least stop timeout a supervisor must allow a process
// with this command line: its Shutdown deadline and the exit after it
// (add the preStop hook's time in Kubernetes).
func (c config) graceBound() time.Duration {
	return cmp.Or(c.stop, stopBound(c.handoff, c.drain, runner.DefaultOpTimeout)) + exitMargin
}

// runnerConfig is the runner's configuration on this command line;
// debugAddr is where the debug page listens.
func (c config) runnerConfig(debugAddr string, log *slog.Logger) (runner.Config, error) {
	cfg := runner.Config{
		ID: c.id, NumShards: c.shards, LeaseTTL: c.ttl, Logger: log,
		ShutdownHandoffTimeout: c.handoff, DrainTimeout: c.drain,
	}
	if c.role == "gateway" {
		cfg.ClientOnly = true
	} else {
		cfg.ListenAddr = c.listen
		cfg.Address = c.address
		cfg.DebugURL = cmp.Or(c.debugURL, "http://"+debugAddr+DebugPath)
	}
	return cfg, c.security.runnerTLS(&cfg)
}
