package runner

import (
	"net/http"

	"github.com/shardhost/shardhost/internal/debugpage"
)

// The debug page lives in internal/debugpage; the names below keep it part
// of this package's API. The field-by-field documentation of each type is
// in its definition (go doc github.com/shardhost/shardhost/internal/debugpage).

// DebugSchema names the version of the JSON document the debug handler
// serves (DebugState). Fields are only ever added under one schema name.
const DebugSchema = debugpage.Schema

// Defaults of DebugConfig: the page refreshes every 2 s, and the fetch of
// one peer's state is bounded by 500 ms.
const (
	DefaultDebugRefresh     = debugpage.DefaultRefresh
	DefaultDebugPeerTimeout = debugpage.DefaultPeerTimeout
)

// DebugConfig holds the optional settings of a debug handler, zero fields
// meaning the defaults: PeerURL (the URL of each runner's own debug page,
// so that every request also fetches the peers' states), PeerTimeout (the
// bound of one peer's fetch, DefaultDebugPeerTimeout), HTTPClient (what
// fetches them) and Refresh (how often the page reloads in the browser,
// DefaultDebugRefresh; negative: never).
type DebugConfig = debugpage.Config

// DebugState is everything the debug handler shows, as served with
// ?format=json: this runner (Self), the registered runners, the shard map,
// the handoffs in flight, the kinds registered here and the latest events.
// It is the view of the runner serving it: the membership, locks and
// handoff records are its watch caches, the assignment the one it
// computed last.
type DebugState = debugpage.State

// DebugSelf is the state of one runner as it knows it itself: phase,
// lease and its deadline lag, shard and entity counts, message counters.
type DebugSelf = debugpage.Self

// DebugDetach says why and since when a runner is detached.
type DebugDetach = debugpage.Detach

// DebugRunner is one registered runner (its record) as the serving runner
// sees it — shards owned and assigned, colour in the shard map, the URL of
// its page — with its own state (a DebugSelf) when known.
type DebugRunner = debugpage.Runner

// Owner codes of DebugShards.Owner besides indexes into DebugState.Runners.
const (
	DebugUnowned      = debugpage.Unowned      // no lock
	DebugUnknownOwner = debugpage.UnknownOwner // locked under a lease of no registered runner
)

// DebugShards is the shard map: the owner of each shard (an index into
// DebugState.Runners, DebugUnowned or DebugUnknownOwner), totals, and the
// shards whose lock is not where the assignment wants it (DebugMove).
type DebugShards = debugpage.Shards

// DebugMove is a shard whose owner differs from its assigned runner.
type DebugMove = debugpage.Move

// DebugHandoff is a handoff record in flight: shard, source, target and
// phase (empty for a record between two other runners).
type DebugHandoff = debugpage.Handoff

// DebugKind is one entity kind registered on the serving runner, with its
// resident entities and message counters.
type DebugKind = debugpage.Kind

// DebugEvent is one of the serving runner's events: its time, Go type
// name (e.g. ShardAcquired), and shard, epoch and detail when they apply.
type DebugEvent = debugpage.Event

// DebugHandler returns an http.Handler serving a page that shows this
// runner and the cluster as it sees it — runners, the shard map, handoffs
// in flight, entities and message rates per kind, recent events — and the
// same data as JSON with ?format=json (or Accept: application/json). Mount
// it like net/http/pprof, e.g. mux.Handle("/debug/shardhost/", h).
//
// The handler is read-only: it changes nothing in the runner or the
// store. A request copies the runner's view under its mutex (O(shards))
// and counts resident entities shard by shard (O(entities)); the page is
// server-rendered (no external assets) and refreshes itself by fetching
// its own body again. Query parameters: format=json, pretty=1 (indented
// JSON), epochs=1 (per-shard epochs in the JSON), peers=0 (do not fetch
// the peers' states). It has no authentication of its own: the package
// documentation (Debug page) says what it exposes, and
// ExampleRunner_DebugHandler mounts it behind a middleware.
func (r *Runner) DebugHandler(cfg DebugConfig) http.Handler {
	return debugpage.Handler(debugSource{r}, cfg)
}
