package runner

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// DebugSchema names the version of the JSON document the debug handler
// serves (DebugState). Fields are only ever added under one schema name.
const DebugSchema = "shardhost.debug/v1"

// Defaults of DebugConfig.
const (
	DefaultDebugRefresh     = 2 * time.Second
	DefaultDebugPeerTimeout = 500 * time.Millisecond
)

// DebugConfig holds the optional settings of a debug handler. Zero fields
// mean the documented defaults.
type DebugConfig struct {
	// PeerURL returns the URL at which the runner with the given ID serves
	// its own debug handler ("" when unknown). With it, every request also
	// fetches each listed runner's state (JSON, bounded by PeerTimeout,
	// concurrently), so the runners table shows every runner's phase,
	// detach reason, lease deadline lag and message rates, and links to
	// its page. Without it only this runner's own state is known.
	PeerURL func(runnerID string) string
	// PeerTimeout bounds the fetch of one peer's state. Default 500 ms.
	PeerTimeout time.Duration
	// HTTPClient fetches the peers' states. Default: a client without
	// cookies or redirects beyond the standard ones, bounded by PeerTimeout.
	HTTPClient *http.Client
	// Refresh is how often the page reloads its content in the browser.
	// Default 2 s; negative: never (the page is still current when loaded).
	Refresh time.Duration
}

func (c DebugConfig) withDefaults() DebugConfig {
	if c.PeerTimeout <= 0 {
		c.PeerTimeout = DefaultDebugPeerTimeout
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: c.PeerTimeout}
	}
	if c.Refresh == 0 {
		c.Refresh = DefaultDebugRefresh
	}
	return c
}

// DebugState is everything the debug handler shows, as served with
// ?format=json. It is the view of the runner serving it: the membership,
// locks and handoff records are its watch caches, the assignment the one
// it computed last.
type DebugState struct {
	Schema   string         `json:"schema"` // DebugSchema
	Time     time.Time      `json:"time"`   // when the state was taken
	Self     DebugSelf      `json:"self"`
	Runners  []DebugRunner  `json:"runners"` // registered runners, by ID
	Shards   DebugShards    `json:"shards"`
	Handoffs []DebugHandoff `json:"handoffs"` // handoff records in flight, by shard
	Kinds    []DebugKind    `json:"kinds"`    // kinds registered on this runner, by name
	Events   []DebugEvent   `json:"events"`   // this runner's latest events, newest first
}

// DebugSelf is the state of one runner as it knows it itself.
type DebugSelf struct {
	ID          string `json:"id"`
	Incarnation string `json:"incarnation"`
	Address     string `json:"address,omitempty"`
	ClientOnly  bool   `json:"client_only,omitempty"`
	// Phase: new, starting, attached, detached, stopping or stopped.
	Phase    string       `json:"phase"`
	Attached bool         `json:"attached"`
	Detached *DebugDetach `json:"detached,omitempty"` // while detached
	Lease    string       `json:"lease,omitempty"`    // hexadecimal, as etcdctl prints it
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
	// two requests to this handler at least a second apart (absent on the
	// first request).
	MessagesPerSec    *float64 `json:"messages_per_s,omitempty"`
	MailboxRejections uint64   `json:"mailbox_rejections"`
	AssignmentError   string   `json:"assignment_error,omitempty"`
}

// DebugDetach says why and since when a runner is detached.
type DebugDetach struct {
	Reason string    `json:"reason"`
	Detail string    `json:"detail,omitempty"`
	Since  time.Time `json:"since"`
}

// DebugRunner is one registered runner (its record) as the serving runner
// sees it, with its own state when known.
type DebugRunner struct {
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
	URL         string    `json:"url,omitempty"` // its debug page (DebugConfig.PeerURL)
	// State is what the runner reports itself: this runner's Self, or a
	// peer's fetched from URL. StateError says why a peer's is missing.
	State      *DebugSelf `json:"state,omitempty"`
	StateError string     `json:"state_error,omitempty"`
}

// Owner codes of DebugShards.Owner besides indexes into DebugState.Runners.
const (
	DebugUnowned      = -1 // no lock
	DebugUnknownOwner = -2 // locked under a lease of no registered runner
)

// DebugShards is the shard map.
type DebugShards struct {
	Count   int `json:"count"`
	Owned   int `json:"owned"`   // locked by a registered runner
	Unowned int `json:"unowned"` // no lock
	// UnknownOwner: locked under a lease no registered runner holds (a
	// crashed runner whose lease has not expired, after its ID registered
	// again).
	UnknownOwner int `json:"unknown_owner"`
	// Owner has one entry per shard: the index of its owner in
	// DebugState.Runners, DebugUnowned or DebugUnknownOwner.
	Owner []int `json:"owner"`
	// Epoch has one entry per shard (0: unowned); only with ?epochs=1.
	Epoch []int64 `json:"epoch,omitempty"`
	// Moves lists the shards whose lock is not where the assignment wants
	// it: they are being acquired or handed off.
	Moves []DebugMove `json:"moves"`
}

// DebugMove is a shard whose owner differs from its assigned runner.
type DebugMove struct {
	Shard sharding.ShardID `json:"shard"`
	From  string           `json:"from,omitempty"` // "" when unowned
	To    string           `json:"to"`
}

// DebugHandoff is a handoff record.
type DebugHandoff struct {
	Shard sharding.ShardID `json:"shard"`
	From  string           `json:"from"`
	To    string           `json:"to"`
	// Phase is warming or ready; empty for a record between two other
	// runners, which the serving runner does not decode (From and To then
	// come from the lock's and the record's leases).
	Phase string `json:"phase,omitempty"`
}

// DebugKind is one entity kind registered on the serving runner.
type DebugKind struct {
	Kind              string   `json:"kind"`
	Active            int      `json:"active"`   // resident entities
	Messages          uint64   `json:"messages"` // handled since registration
	MessagesPerSec    *float64 `json:"messages_per_s,omitempty"`
	MailboxRejections uint64   `json:"mailbox_rejections"`
}

// DebugEvent is one of the serving runner's events.
type DebugEvent struct {
	Time   time.Time         `json:"time"`
	Type   string            `json:"type"` // the event's Go type name, e.g. ShardAcquired
	Shard  *sharding.ShardID `json:"shard,omitempty"`
	Epoch  storage.Epoch     `json:"epoch,omitempty"`
	Detail string            `json:"detail,omitempty"`
}

// debugEvents is how many events the state carries.
const debugEvents = 100

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
// the peers' states).
func (r *Runner) DebugHandler(cfg DebugConfig) http.Handler {
	return &debugHandler{r: r, cfg: cfg.withDefaults()}
}

type debugHandler struct {
	r     *Runner
	cfg   DebugConfig
	rates rateSampler
}

func (h *debugHandler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the shardhost debug handler is read-only", http.StatusMethodNotAllowed)
		return
	}
	q := req.URL.Query()
	st := h.state(req.Context(), q.Get("epochs") == "1", q.Get("peers") != "0")
	w.Header().Set("Cache-Control", "no-store")
	out := compressed(w, req)
	defer out.Close()
	if q.Get("format") == "json" || (q.Get("format") == "" && q.Get("part") == "" && acceptsJSON(req)) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(out)
		if q.Get("pretty") == "1" {
			enc.SetIndent("", "  ")
		}
		_ = enc.Encode(st)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = renderDebug(out, st, h.cfg, q.Get("part") == "body")
}

func acceptsJSON(req *http.Request) bool {
	a := req.Header.Get("Accept")
	return strings.Contains(a, "application/json") && !strings.Contains(a, "text/html")
}

// compressed returns w, gzip-compressed when the client accepts it (a
// shard map of 16 384 cells is ~300 KB of HTML, ~15 KB compressed).
func compressed(w http.ResponseWriter, req *http.Request) io.WriteCloser {
	if !strings.Contains(req.Header.Get("Accept-Encoding"), "gzip") {
		return nopCloser{w}
	}
	w.Header().Set("Content-Encoding", "gzip")
	w.Header().Add("Vary", "Accept-Encoding")
	return gzip.NewWriter(w)
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// state builds the DebugState.
func (h *debugHandler) state(ctx context.Context, epochs, peers bool) *DebugState {
	r := h.r
	now := time.Now()
	v := r.view()
	health, det := r.health()
	kinds := r.kindCounts()
	st := &DebugState{Schema: DebugSchema, Time: now}

	// This runner.
	self := DebugSelf{
		ID: r.cfg.ID, Incarnation: r.incarnation, Address: v.address, ClientOnly: r.cfg.ClientOnly,
		Phase: v.phase.String(), Attached: v.phase == phaseAttached, Started: v.started,
		DetachMarginMS: ms(r.cfg.DetachMargin), NumShards: r.cfg.NumShards, Strategy: r.cfg.Strategy.Name(),
		Weight: r.cfg.Weight, Owned: len(v.owned), Pending: v.pending, Releasing: v.releasing,
		InboundHandoffs: v.inbound, KeepAliveFailureStreak: health.FailureStreak, Entities: r.EntityCount(),
	}
	if v.phase == phaseDetached {
		self.Detached = &DebugDetach{Reason: det.Reason.String(), Detail: det.Detail, Since: det.Since}
	}
	if health.Lease != storage.NoLease && !r.cfg.ClientOnly {
		self.Lease = fmt.Sprintf("%x", health.Lease)
		self.LeaseTTLMS = ms(health.TTL)
		lag := ms(health.Deadline.Sub(now))
		self.LeaseDeadlineLagMS = &lag
	}
	if v.assignErr != nil {
		self.AssignmentError = v.assignErr.Error()
	}
	counts := map[string]uint64{}
	for _, k := range kinds {
		self.Messages += k.handled
		self.MailboxRejections += k.rejected
		counts["kind:"+k.name] = k.handled
	}
	counts["total"] = self.Messages
	rates := h.rates.update(now, counts)
	if rate, ok := rates["total"]; ok {
		self.MessagesPerSec = &rate
	}
	for _, k := range kinds {
		dk := DebugKind{Kind: k.name, Active: k.active, Messages: k.handled, MailboxRejections: k.rejected}
		if rate, ok := rates["kind:"+k.name]; ok {
			dk.MessagesPerSec = &rate
		}
		st.Kinds = append(st.Kinds, dk)
	}

	// Runners and the shard map.
	index := make(map[string]int, len(v.members))
	for i, m := range v.members {
		index[m.ID] = i
		st.Runners = append(st.Runners, DebugRunner{
			ID: m.ID, Address: m.Address, Weight: m.Weight, Incarnation: m.Incarnation, Draining: m.Draining,
			Started: m.Started, Lease: fmt.Sprintf("%x", m.Lease), Self: m.ID == r.cfg.ID,
		})
	}
	ids := make([]string, len(v.members))
	for i, m := range v.members {
		ids[i] = m.ID
	}
	for i, c := range runnerColors(ids) {
		st.Runners[i].Color = c
	}
	n := r.cfg.NumShards
	sh := DebugShards{Count: n, Owner: make([]int, n), Moves: []DebugMove{}}
	if epochs {
		sh.Epoch = make([]int64, n)
	}
	for i := range sh.Owner {
		sh.Owner[i] = DebugUnowned
	}
	for _, l := range v.locks {
		if int(l.Shard) >= n {
			continue
		}
		id, live := v.byLease[l.Lease]
		i, listed := index[id]
		switch {
		case live && listed:
			sh.Owner[l.Shard] = i
			st.Runners[i].Owned++
		default:
			sh.Owner[l.Shard] = DebugUnknownOwner
		}
		if epochs {
			sh.Epoch[l.Shard] = int64(l.Epoch)
		}
	}
	for s, o := range sh.Owner {
		switch o {
		case DebugUnowned:
			sh.Unowned++
		case DebugUnknownOwner:
			sh.UnknownOwner++
		default:
			sh.Owned++
		}
		if s >= len(v.assignment) || v.assignment[s] == "" {
			continue
		}
		to := v.assignment[s]
		if i, ok := index[to]; ok {
			st.Runners[i].Assigned++
		}
		if o < 0 || st.Runners[o].ID != to {
			mv := DebugMove{Shard: sharding.ShardID(s), To: to}
			if o >= 0 {
				mv.From = st.Runners[o].ID
			}
			sh.Moves = append(sh.Moves, mv)
		}
	}
	st.Shards = sh
	if i, ok := index[r.cfg.ID]; ok {
		self.Assigned = st.Runners[i].Assigned
	}
	st.Self = self
	st.Handoffs = make([]DebugHandoff, 0, len(v.handoffs))
	for _, ho := range v.handoffs {
		dh := DebugHandoff{Shard: ho.Shard, From: ho.From, To: ho.To, Phase: string(ho.Phase)}
		if dh.To == "" { // a record between two other runners: not decoded, known by its lease
			dh.To = v.byLease[ho.Lease]
			if int(ho.Shard) < n && sh.Owner[ho.Shard] >= 0 {
				dh.From = st.Runners[sh.Owner[ho.Shard]].ID
			}
		}
		st.Handoffs = append(st.Handoffs, dh)
	}
	for _, ev := range r.recentEvents(debugEvents) {
		st.Events = append(st.Events, debugEvent(ev))
	}
	if st.Runners == nil {
		st.Runners = []DebugRunner{}
	}
	if st.Kinds == nil {
		st.Kinds = []DebugKind{}
	}
	if st.Events == nil {
		st.Events = []DebugEvent{}
	}

	// Every runner's own state.
	var wg sync.WaitGroup
	for i := range st.Runners {
		dr := &st.Runners[i]
		if h.cfg.PeerURL != nil {
			dr.URL = h.cfg.PeerURL(dr.ID)
		}
		switch {
		case dr.Self:
			dr.State = &st.Self
		case dr.URL != "" && peers:
			wg.Go(func() { dr.State, dr.StateError = h.fetchPeer(ctx, dr.ID, dr.Incarnation, dr.URL) })
		}
	}
	wg.Wait()
	return st
}

// fetchPeer returns the state runner id reports at its debug URL.
func (h *debugHandler) fetchPeer(ctx context.Context, id, incarnation, base string) (*DebugSelf, string) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Sprintf("bad URL %q: %v", base, err)
	}
	q := u.Query()
	q.Set("format", "json")
	q.Set("peers", "0")
	u.RawQuery = q.Encode()
	ctx, cancel := context.WithTimeout(ctx, h.cfg.PeerTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err.Error()
	}
	resp, err := h.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, "unreachable: " + err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, "unreachable: " + resp.Status
	}
	var st DebugState
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&st); err != nil {
		return nil, "bad answer: " + err.Error()
	}
	switch {
	case st.Schema != DebugSchema:
		return nil, fmt.Sprintf("bad answer: schema %q, want %q", st.Schema, DebugSchema)
	case st.Self.ID != id:
		return nil, fmt.Sprintf("%s serves runner %q", base, st.Self.ID)
	case st.Self.Incarnation != incarnation:
		return &st.Self, "another incarnation answers (restarted?)"
	}
	return &st.Self, ""
}

func debugEvent(ev Event) DebugEvent {
	shard := func(id sharding.ShardID) *sharding.ShardID { return &id }
	out := DebugEvent{Time: ev.Base().Time}
	switch e := ev.(type) {
	case ShardAcquired:
		out.Type, out.Shard, out.Epoch = "ShardAcquired", shard(e.Shard), e.Epoch
	case ShardReleased:
		out.Type, out.Shard, out.Epoch = "ShardReleased", shard(e.Shard), e.Epoch
	case ShardLost:
		out.Type, out.Shard, out.Epoch = "ShardLost", shard(e.Shard), e.Epoch
		if e.Cause != nil {
			out.Detail = e.Cause.Error()
		}
	case Registered:
		out.Type, out.Detail = "Registered", fmt.Sprintf("lease %x", e.Lease)
	case Detached:
		out.Type, out.Detail = "Detached", e.Reason.String()
		if e.Detail != "" {
			out.Detail += ": " + e.Detail
		}
	case Reattached:
		out.Type, out.Detail = "Reattached", fmt.Sprintf("lease %x", e.Lease)
		if e.NewLease {
			out.Detail += " (new lease)"
		}
	case HandoffPhase:
		out.Type, out.Shard = "HandoffPhase", shard(e.Shard)
		out.Detail = fmt.Sprintf("%s %s -> %s", e.Phase, e.From, e.To)
		if e.Detail != "" {
			out.Detail += ": " + e.Detail
		}
	default:
		out.Type = strings.TrimPrefix(fmt.Sprintf("%T", ev), "runner.")
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// debugPalette holds well-separated colours (no red: red marks unowned
// shards) for the first runners of a shard map.
var debugPalette = []string{
	"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2",
	"#9c755f", "#a0cbe8", "#8cd17d", "#d37295", "#ffbe7d", "#79706e",
}

// runnerColors returns the colour of each runner in the shard map. A
// runner's colour comes from a hash of its ID, so it stays the same while
// others join and leave, and on every runner's page; two runners whose
// hashes collide take the next free palette colour in ID order. Past the
// palette, colours are hues from the hash (distinct, not always far apart).
func runnerColors(ids []string) []string {
	out := make([]string, len(ids))
	taken := make([]bool, len(debugPalette))
	for i, id := range ids {
		f := fnv.New32a()
		_, _ = f.Write([]byte(id))
		x := f.Sum32()
		if i >= len(debugPalette) {
			out[i] = fmt.Sprintf("hsl(%d 55%% %d%%)", x%360, 40+x/360%3*10)
			continue
		}
		slot := int(x % uint32(len(debugPalette)))
		for taken[slot] {
			slot = (slot + 1) % len(debugPalette)
		}
		taken[slot] = true
		out[i] = debugPalette[slot]
	}
	return out
}

// rateSampler turns counters into rates over the interval between two
// requests at least rateInterval apart; requests in between reuse the last
// rates.
type rateSampler struct {
	mu     sync.Mutex
	at     time.Time
	counts map[string]uint64
	rates  map[string]float64
}

const rateInterval = time.Second

func (s *rateSampler) update(now time.Time, counts map[string]uint64) map[string]float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.at.IsZero() {
		s.at, s.counts = now, counts
		return nil
	}
	if dt := now.Sub(s.at); dt >= rateInterval {
		rates := make(map[string]float64, len(counts))
		for k, c := range counts {
			if prev, ok := s.counts[k]; ok && c >= prev {
				rates[k] = float64(c-prev) / dt.Seconds()
			}
		}
		s.at, s.counts, s.rates = now, counts, rates
	}
	return s.rates
}
