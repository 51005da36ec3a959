package debugpage

import (
	"net/http"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Schema names the version of the JSON document the handler serves
// (State). Fields are only ever added under one schema name.
const Schema = "shardhost.debug/v1"

// Defaults of Config.
const (
	DefaultRefresh     = 2 * time.Second
	DefaultPeerTimeout = 500 * time.Millisecond
)

// Config holds the optional settings of a debug handler. Zero fields mean
// the documented defaults.
type Config struct {
	// PeerURL returns the URL at which the runner with the given ID serves
	// its own debug handler ("" when there is none). Every request fetches
	// each listed runner's state from its URL (JSON, bounded by
	// PeerTimeout, concurrently), so the runners table shows every runner's
	// phase, detach reason, lease deadline lag and message rates, marks a
	// runner whose page does not answer unreachable, and links to its page.
	// When PeerURL is set it alone decides: a runner it returns "" for has
	// no URL, whatever its record publishes. When it is nil, the URLs are
	// the ones the runners publish in their records (their
	// runner.Config.DebugURL): whoever may write the namespace in the store
	// chooses those, so they are fetched without HTTPClient (see there).
	PeerURL func(runnerID string) string
	// PeerTimeout bounds the fetch of one peer's state. Default 500 ms.
	PeerTimeout time.Duration
	// HTTPClient fetches the peers' states at the URLs PeerURL returns, and
	// only those: give it the credentials the peers' pages want. Default:
	// a client without cookies, bounded by PeerTimeout. The URLs runners
	// publish (no PeerURL) are fetched by a client of the handler's own,
	// which carries no credentials (no cookies, no client certificate, no
	// Authorization) and the proxy settings of the environment. Either
	// client follows a redirect only to the scheme and host it asked, and
	// never to a URL that carries credentials (user:password@).
	HTTPClient *http.Client
	// Refresh is how often the page reloads its content in the browser.
	// Default 2 s; negative: never (the page is still current when loaded).
	Refresh time.Duration
}

func (c Config) withDefaults() Config {
	if c.PeerTimeout <= 0 {
		c.PeerTimeout = DefaultPeerTimeout
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: c.PeerTimeout}
	} else {
		own := *c.HTTPClient // the caller's stays as it is
		c.HTTPClient = &own
	}
	c.HTTPClient.CheckRedirect = sameOrigin(c.HTTPClient.CheckRedirect)
	if c.Refresh == 0 {
		c.Refresh = DefaultRefresh
	}
	return c
}

// State is everything the debug handler shows, as served with
// ?format=json. It is the view of the runner serving it: the membership,
// locks and handoff records are its watch caches, the assignment the one
// it computed last.
type State struct {
	Schema   string    `json:"schema"` // Schema
	Time     time.Time `json:"time"`   // when the state was taken
	Self     Self      `json:"self"`
	Runners  []Runner  `json:"runners"` // registered runners, by ID
	Shards   Shards    `json:"shards"`
	Handoffs []Handoff `json:"handoffs"` // handoff records in flight, by shard
	Kinds    []Kind    `json:"kinds"`    // kinds registered on this runner, by name
	// Workers are the shard workers and singletons running on this
	// runner, by name then shard; Remembered the remembered entities of
	// each of its shards that has some, by shard.
	Workers    []Worker     `json:"workers"`
	Remembered []ShardCount `json:"remembered"`
	Events     []Event      `json:"events"` // this runner's latest events, newest first
}

// Self is the state of one runner as it knows it itself.
type Self struct {
	ID          string `json:"id"`
	Incarnation string `json:"incarnation"`
	Address     string `json:"address,omitempty"`
	ClientOnly  bool   `json:"client_only,omitempty"`
	// Phase: new, starting, attached, detached, stopping or stopped; a
	// client-only runner (a gateway) that routes says routing.
	Phase    string  `json:"phase"`
	Attached bool    `json:"attached"`
	Detached *Detach `json:"detached,omitempty"` // while detached
	Lease    string  `json:"lease,omitempty"`    // hexadecimal, as etcdctl prints it
	// LeaseTTLMS is the TTL the store granted.
	LeaseTTLMS float64 `json:"lease_ttl_ms,omitempty"`
	// LeaseDeadlineLagMS is the lease deadline minus now (absent without a
	// lease); the runner detaches when it falls to DetachMarginMS.
	LeaseDeadlineLagMS     *float64  `json:"lease_deadline_lag_ms,omitempty"`
	DetachMarginMS         float64   `json:"detach_margin_ms"`
	KeepAliveFailureStreak int       `json:"keepalive_failure_streak"`
	Started                time.Time `json:"started"` // when Run was called (zero before)
	NumShards              int       `json:"num_shards"`
	Strategy               string    `json:"strategy"`
	Weight                 int       `json:"weight"` // configured weight
	Owned                  int       `json:"owned"`  // shards owned now
	Assigned               int       `json:"assigned"`
	Pending                int       `json:"pending"`          // assigned, being acquired
	Releasing              int       `json:"releasing"`        // being released or handed off
	InboundHandoffs        int       `json:"inbound_handoffs"` // being warmed here
	Entities               int       `json:"entities"`         // resident entities
	Messages               uint64    `json:"messages"`         // handled since start, all kinds
	// MessagesPerSec is the rate of Messages over the interval between
	// two samples at least a second apart: the handler's creation and its
	// requests (absent when the first request comes within a second of
	// the handler's creation).
	MessagesPerSec    *float64 `json:"messages_per_s,omitempty"`
	MailboxRejections uint64   `json:"mailbox_rejections"`
	AssignmentError   string   `json:"assignment_error,omitempty"`
	// Gateway is a client-only runner's routing state (absent for a
	// hosting runner).
	Gateway *GatewayView `json:"gateway,omitempty"`
	// NotStarted says why a runner that is not ready yet is not, once a
	// start call to the store failed: "not started: etcd at ...
	// unreachable since ...".
	NotStarted string `json:"not_started,omitempty"`
}

// Detach says why and since when a runner is detached.
type Detach struct {
	Reason string    `json:"reason"`
	Detail string    `json:"detail,omitempty"`
	Since  time.Time `json:"since"`
}

// Runner is one registered runner (its record) as the serving runner sees
// it, with its own state when known.
type Runner struct {
	ID          string    `json:"id"`
	Address     string    `json:"address,omitempty"`
	Weight      int       `json:"weight"`
	Incarnation string    `json:"incarnation"`
	Draining    bool      `json:"draining"`
	Started     time.Time `json:"started"`
	Lease       string    `json:"lease"`
	Owned       int       `json:"owned"`    // shards whose lock is under its lease
	Assigned    int       `json:"assigned"` // shards the assignment gives it
	Color       string    `json:"color"`    // its colour in the shard map (CSS)
	Self        bool      `json:"self,omitempty"`
	URL         string    `json:"url,omitempty"` // its debug page (Config.PeerURL's, or its record's DebugURL), without credentials
	// State is what the runner reports itself: this runner's Self, or a
	// peer's fetched from URL. StateError says why a peer's is missing.
	State      *Self  `json:"state,omitempty"`
	StateError string `json:"state_error,omitempty"`
}

// Owner codes of Shards.Owner besides indexes into State.Runners.
const (
	Unowned      = -1 // no lock
	UnknownOwner = -2 // locked under a lease of no registered runner
)

// Shards is the shard map.
type Shards struct {
	Count   int `json:"count"`
	Owned   int `json:"owned"`   // locked by a registered runner
	Unowned int `json:"unowned"` // no lock
	// UnknownOwner: locked under a lease no registered runner holds (a
	// crashed runner whose lease has not expired, after its ID registered
	// again).
	UnknownOwner int `json:"unknown_owner"`
	// Owner has one entry per shard: the index of its owner in
	// State.Runners, Unowned or UnknownOwner.
	Owner []int `json:"owner"`
	// Epoch has one entry per shard (0: unowned); only with ?epochs=1.
	Epoch []int64 `json:"epoch,omitempty"`
	// Moves lists the shards whose lock is not where the assignment wants
	// it: they are being acquired or handed off.
	Moves []Move `json:"moves"`
}

// Move is a shard whose owner differs from its assigned runner.
type Move struct {
	Shard sharding.ShardID `json:"shard"`
	From  string           `json:"from,omitempty"` // "" when unowned
	To    string           `json:"to"`
}

// Handoff is a handoff record.
type Handoff struct {
	Shard sharding.ShardID `json:"shard"`
	From  string           `json:"from"`
	To    string           `json:"to"`
	// Phase is warming or ready; empty for a record between two other
	// runners, which the serving runner does not decode (From and To then
	// come from the lock's and the record's leases).
	Phase string `json:"phase,omitempty"`
}

// Kind is one entity kind registered on the serving runner.
type Kind struct {
	Kind              string   `json:"kind"`
	Active            int      `json:"active"`   // resident entities
	Messages          uint64   `json:"messages"` // handled since registration
	MessagesPerSec    *float64 `json:"messages_per_s,omitempty"`
	MailboxRejections uint64   `json:"mailbox_rejections"`
}

// Worker is a shard worker or singleton running on the serving runner.
type Worker struct {
	Name      string           `json:"name"`
	Singleton bool             `json:"singleton,omitempty"`
	Shard     sharding.ShardID `json:"shard"`
	Epoch     storage.Epoch    `json:"epoch"`
	Since     time.Time        `json:"since"` // when its current run started
}

// ShardCount is a count for one shard.
type ShardCount struct {
	Shard sharding.ShardID `json:"shard"`
	Count int              `json:"count"`
}

// Event is one of the serving runner's events.
type Event struct {
	Time   time.Time         `json:"time"`
	Type   string            `json:"type"` // the event's Go type name, e.g. ShardAcquired
	Shard  *sharding.ShardID `json:"shard,omitempty"`
	Epoch  storage.Epoch     `json:"epoch,omitempty"`
	Detail string            `json:"detail,omitempty"`
}

// GatewayView is a client-only runner's routing state: its readiness
// (Ready, Reason: whether its membership view is current), the hosting
// runners it sees and the shards it has a route for.
type GatewayView struct {
	Ready   bool   `json:"ready"`
	Reason  string `json:"reason"`
	Members int    `json:"members"`
	Routes  int    `json:"routes"`
}
