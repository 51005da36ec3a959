package runner

import (
	"net/http"

	"github.com/shardhost/shardhost/runner/internal/debugpage"
)

// The debug page lives in internal/debugpage; the names below keep it part
// of this package's API. go doc shows an alias without its fields, so each
// alias's comment lists them (TestAliasesOfInternalTypesListTheirFields
// keeps the lists complete); the JSON names and units are in the
// definitions (go doc github.com/shardhost/shardhost/runner/internal/debugpage).

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
// meaning the defaults. Its fields:
//
//	PeerURL     func(runnerID string) string
//	    the URL of a runner's own debug page. When set, it alone decides
//	    ("": none); nil: the URL each runner publishes (Config.DebugURL).
//	    Every request fetches each runner's own state from its URL, so the
//	    page shows every runner's phase, lease lag and rates, and marks one
//	    whose page does not answer unreachable.
//	PeerTimeout time.Duration
//	    bound of one peer's fetch. Default DefaultDebugPeerTimeout (500 ms).
//	HTTPClient  *http.Client
//	    what fetches the URLs PeerURL returns, and only those: give it the
//	    credentials of the peers' pages. Default: a client bounded by
//	    PeerTimeout. Published URLs (no PeerURL), which whoever may write
//	    the namespace chooses, are fetched without credentials. No fetch
//	    follows a redirect to another scheme or host.
//	Refresh     time.Duration
//	    how often the page reloads its content in the browser. Default
//	    DefaultDebugRefresh (2 s); negative: never.
type DebugConfig = debugpage.Config

// DebugState is everything the debug handler shows, as served with
// ?format=json. It is the view of the runner serving it: the membership,
// locks and handoff records are its watch caches, the assignment the one
// it computed last. Its fields:
//
//	Schema   string          DebugSchema
//	Time     time.Time       when the state was taken
//	Self     DebugSelf       this runner, as it knows itself
//	Runners  []DebugRunner   the registered runners, by ID
//	Shards   DebugShards     the shard map
//	Handoffs []DebugHandoff  handoff records in flight, by shard
//	Kinds    []DebugKind     kinds registered on this runner, by name
//	Workers    []DebugWorker      shard workers and singletons running on this runner
//	Remembered []DebugShardCount  remembered entities of its shards, by shard
//	Events   []DebugEvent    this runner's latest events, newest first
type DebugState = debugpage.State

// DebugSelf is the state of one runner as it knows it itself. Its fields:
//
//	ID, Incarnation, Address      identity; Address "" without transport
//	ClientOnly                    it routes and hosts nothing
//	Phase                         new, starting, attached, detached, stopping or stopped;
//	                              routing for a client-only runner past its start
//	Attached                      Phase is attached
//	Gateway *DebugGateway         a client-only runner's routing state (nil otherwise)
//	Detached *DebugDetach         why and since when, while detached
//	NotStarted                    "not started: etcd at ... unreachable since ...",
//	                              while its start calls to the store fail
//	Lease, LeaseTTLMS             its lease (hexadecimal) and granted TTL
//	LeaseDeadlineLagMS *float64   lease deadline minus now; it detaches at DetachMarginMS
//	DetachMarginMS                Config.DetachMargin
//	KeepAliveFailureStreak        consecutive failed renewals
//	Started                       when Run was called
//	NumShards, Strategy, Weight   its configuration
//	Owned, Assigned               shards owned now, shards its assignment gives it
//	Pending, Releasing            shards being acquired, being released or handed off
//	InboundHandoffs               shards being warmed here
//	Entities                      resident entities
//	Messages                      handled since start, all kinds
//	MessagesPerSec *float64       rate of Messages (see DebugHandler)
//	MailboxRejections             messages refused by a full mailbox
//	AssignmentError               why its last assignment failed ("" if it did not)
type DebugSelf = debugpage.Self

// DebugGateway is a client-only runner's (a gateway's) routing state. Its
// fields: Ready and Reason (its readiness check: whether its membership
// view is current, e.g. "routing to 2 runners" or "store unreachable for
// ..."), Members (the hosting runners it sees) and Routes (the shards it
// has a route for: a live owner's lock it knows, else an assignee that is
// a member).
type DebugGateway = debugpage.GatewayView

// DebugDetach says why and since when a runner is detached. Its fields:
// Reason (the detach reason), Detail and Since.
type DebugDetach = debugpage.Detach

// DebugRunner is one registered runner (its record) as the serving runner
// sees it, with its own state when known. Its fields:
//
//	ID, Address, Weight, Incarnation, Draining, Started, Lease
//	                      its runner record (Lease hexadecimal)
//	Owned, Assigned       shards locked under its lease, shards the assignment gives it
//	Color                 its colour in the shard map (CSS)
//	Self                  it is the runner serving the page
//	URL                   its debug page: DebugConfig.PeerURL's, or (without) its record's
//	                      DebugURL; shown without credentials
//	State *DebugSelf      what it reports itself (fetched from URL; Self's own)
//	StateError            why State is missing: "unreachable: ..." when its
//	                      page does not answer (e.g. its process died)
type DebugRunner = debugpage.Runner

// Owner codes of DebugShards.Owner besides indexes into DebugState.Runners.
const (
	DebugUnowned      = debugpage.Unowned      // no lock
	DebugUnknownOwner = debugpage.UnknownOwner // locked under a lease of no registered runner
)

// DebugShards is the shard map. Its fields: Count; Owned (locked by a
// registered runner), Unowned (no lock) and UnknownOwner (locked under a
// lease of no registered runner); Owner, per shard, an index into
// DebugState.Runners, DebugUnowned or DebugUnknownOwner; Epoch, per shard,
// only with ?epochs=1; Moves, the shards whose lock is not where the
// assignment wants it (DebugMove).
type DebugShards = debugpage.Shards

// DebugMove is a shard whose owner differs from its assigned runner. Its
// fields: Shard, From (its owner, "" when unowned) and To (its assignee).
type DebugMove = debugpage.Move

// DebugHandoff is a handoff record in flight. Its fields: Shard, From, To
// and Phase (warming or ready; empty for a record between two other
// runners).
type DebugHandoff = debugpage.Handoff

// DebugKind is one entity kind registered on the serving runner. Its
// fields: Kind (its name), Active (resident entities), Messages (handled
// since registration), MessagesPerSec (their rate, see DebugHandler) and
// MailboxRejections.
type DebugKind = debugpage.Kind

// DebugWorker is a shard worker or singleton running on the serving
// runner. Its fields: Name, Singleton, Shard, Epoch (the shard's on this
// runner) and Since (when its current run started).
type DebugWorker = debugpage.Worker

// DebugShardCount is a count for one shard. Its fields: Shard, Count.
type DebugShardCount = debugpage.ShardCount

// DebugEvent is one of the serving runner's events. Its fields: Time, Type
// (the event's Go type name, e.g. ShardAcquired), and Shard, Epoch and
// Detail when they apply.
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
// ExampleRunner_DebugHandler mounts it behind a middleware (with
// cfg.HTTPClient carrying the credentials for the peers' pages).
//
// Every request fetches each registered runner's own state from its
// debug URL: the one cfg.PeerURL returns, or, without PeerURL, the one it
// publishes (Config.DebugURL on every runner, the URL where its process
// mounts this handler). Each page then shows every runner's phase, lease
// lag and rates, and marks a runner whose process is gone unreachable at
// once (its shards hatched) instead of showing it healthy until its lease
// expires. Published URLs are fetched without credentials: behind
// authentication, give cfg.PeerURL and cfg.HTTPClient (SECURITY.md, The
// debug page). Rates are counter deltas between samples at least a second
// apart: the handler's creation, then its requests, so the first page
// already shows them — make the handler once, when the process starts.
func (r *Runner) DebugHandler(cfg DebugConfig) http.Handler {
	return debugpage.Handler(debugSource{r}, cfg)
}
