package runner_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/net/html"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// debugNode is a runner serving its debug handler on a loopback server.
type debugNode struct {
	*started
	srv *httptest.Server
	rec *recorder // its events
}

// debugCluster starts runners with the given IDs on one in-memory cluster
// (numShards shards, the who kind registered), each serving its debug
// handler and publishing its URL (Config.DebugURL; no PeerURL), and waits
// until they own an exact partition.
func debugCluster(t *testing.T, numShards int, ids ...string) ([]*debugNode, *entity.MethodRef[who, whoReq, whoResp]) {
	t.Helper()
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	_, kind, do := newWho()
	var nodes []*debugNode
	var rs []*started
	for _, id := range ids {
		rec := newRecorder(t)
		var h atomic.Pointer[http.Handler] // set once the runner exists
		srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { (*h.Load()).ServeHTTP(w, req) }))
		// A full lock view: the pages draw every shard's lock.
		r := start(t, c, rec, runner.Config{ID: id, NumShards: numShards, ListenAddr: "127.0.0.1:0", DebugURL: srv.URL + "/", FullLockView: true})
		if err := r.Register(kind); err != nil {
			t.Fatal(err)
		}
		dh := r.DebugHandler(runner.DebugConfig{PeerTimeout: 10 * time.Second}) // a loaded machine answers slowly under -race
		h.Store(&dh)
		nodes = append(nodes, &debugNode{started: r, srv: srv, rec: rec})
		rs = append(rs, r)
	}
	waitFor(t, 10*time.Second, "an exact partition", func() bool { ok, _ := partitionOK(rs, numShards); return ok })
	// A page draws its runner's lock view, which shows another runner's
	// acquisitions a moment after they happen (its lock watch): wait until
	// every runner's view shows the owners of the partition.
	waitFor(t, 10*time.Second, "every runner's lock view showing the owners", func() bool {
		a := rs[0].Assignment()
		for _, r := range rs {
			for s := range numShards {
				if o, _ := r.OwnerOf(sharding.ShardID(s)); o != a[s] {
					return false
				}
			}
		}
		return true
	})
	return nodes, do
}

// newServer serves h on a loopback port until the test ends.
func newServer(t *testing.T, h http.Handler) *httptest.Server {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	return b
}

func getState(t *testing.T, url string) runner.DebugState {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(get(t, url)))
	dec.DisallowUnknownFields() // the document is exactly DebugState
	var st runner.DebugState
	if err := dec.Decode(&st); err != nil {
		t.Fatalf("decode %s: %v", url, err)
	}
	return st
}

// keysOf returns the sorted keys of a JSON object.
func keysOf(t *testing.T, v any) []string {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%v is not a JSON object", v)
	}
	return slices.Sorted(maps.Keys(m))
}

// TestDebugStateJSON: the JSON of a settled 3-runner cluster has the
// documented fields, matches what the runners own (owner and epoch of
// every shard), carries every runner's own state fetched from its peers,
// and counts exactly the messages each runner handled.
func TestDebugStateJSON(t *testing.T) {
	const n = 64
	nodes, do := debugCluster(t, n, "a", "b", "c")
	served := map[string]int{}
	for i := range 200 {
		resp, err := do.Ask(t.Context(), nodes[0], fmt.Sprintf("e%d", i), whoReq{})
		if err != nil {
			t.Fatal(err)
		}
		served[resp.Runner]++
	}

	raw := get(t, nodes[0].srv.URL+"/?format=json&epochs=1")
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	// The schema: renaming or dropping a field is a breaking change. Rates
	// appear once a second has passed since the handler was made.
	optional := []string{"messages_per_s"}
	for _, c := range []struct {
		name string
		v    any
		want []string
	}{
		{"document", doc, []string{"events", "handoffs", "kinds", "remembered", "runners", "schema", "self", "shards", "time", "workers"}},
		{"self", doc["self"], []string{"address", "assigned", "attached", "detach_margin_ms", "entities", "inbound_handoffs",
			"incarnation", "id", "keepalive_failure_streak", "lease", "lease_deadline_lag_ms", "lease_ttl_ms", "mailbox_rejections",
			"messages", "num_shards", "owned", "pending", "phase", "releasing", "started", "strategy", "weight"}},
		{"runner", doc["runners"].([]any)[1], []string{"address", "assigned", "color", "draining", "id", "incarnation", "lease",
			"owned", "started", "state", "url", "weight"}},
		{"shards", doc["shards"], []string{"count", "epoch", "moves", "owned", "owner", "unknown_owner", "unowned"}},
		{"kind", doc["kinds"].([]any)[0], []string{"active", "kind", "mailbox_rejections", "messages"}},
	} {
		want := slices.Sorted(slices.Values(c.want))
		got := slices.DeleteFunc(keysOf(t, c.v), func(k string) bool { return slices.Contains(optional, k) })
		if !slices.Equal(got, want) {
			t.Errorf("%s keys = %v, want %v", c.name, got, want)
		}
	}

	// Events: time and type always; shard, epoch and detail when they apply.
	for _, ev := range doc["events"].([]any) {
		keys := keysOf(t, ev)
		if !slices.Contains(keys, "time") || !slices.Contains(keys, "type") ||
			slices.ContainsFunc(keys, func(k string) bool { return !slices.Contains([]string{"time", "type", "shard", "epoch", "detail"}, k) }) {
			t.Errorf("event keys %v, want time, type and some of shard, epoch, detail", keys)
		}
	}

	st := getState(t, nodes[0].srv.URL+"/?format=json&epochs=1")
	if st.Schema != runner.DebugSchema {
		t.Errorf("schema %q, want %q", st.Schema, runner.DebugSchema)
	}
	if st.Self.ID != "a" || !st.Self.Attached || st.Self.Phase != "attached" || st.Self.NumShards != n {
		t.Errorf("self = %+v, want a, attached, %d shards", st.Self, n)
	}
	if lag := st.Self.LeaseDeadlineLagMS; lag == nil || *lag <= 0 || *lag > st.Self.LeaseTTLMS {
		t.Errorf("lease deadline lag %v, want in (0, TTL %v]", lag, st.Self.LeaseTTLMS)
	}
	var ids []string
	for i, r := range st.Runners {
		ids = append(ids, r.ID)
		node := nodes[i]
		if r.State == nil || r.StateError != "" {
			t.Errorf("runner %s: no state (%q)", r.ID, r.StateError)
			continue
		}
		if r.State.ID != r.ID || r.State.Incarnation != node.Status().Incarnation || !r.State.Attached {
			t.Errorf("runner %s state = %+v, want its own, attached", r.ID, *r.State)
		}
		if r.Self != (r.ID == "a") || r.URL != node.srv.URL+"/" {
			t.Errorf("runner %s: self %v, url %q", r.ID, r.Self, r.URL)
		}
		if got := r.State.Messages; got != uint64(served[r.ID]) {
			t.Errorf("runner %s reports %d messages handled, but served %d asks", r.ID, got, served[r.ID])
		}
		owned := node.Owned()
		if r.Owned != len(owned) || r.Assigned != len(owned) {
			t.Errorf("runner %s: owned %d, assigned %d in the page; owns %d", r.ID, r.Owned, r.Assigned, len(owned))
		}
		for s, e := range owned {
			if st.Shards.Owner[s] != i || st.Shards.Epoch[s] != int64(e) {
				t.Errorf("shard %d: owner %d epoch %d in the page; owned by %s (%d) at %d", s, st.Shards.Owner[s], st.Shards.Epoch[s], r.ID, i, e)
			}
		}
	}
	if !slices.Equal(ids, []string{"a", "b", "c"}) {
		t.Errorf("runners %v, want a b c", ids)
	}
	if sh := st.Shards; sh.Count != n || len(sh.Owner) != n || sh.Owned != n || sh.Unowned != 0 || sh.UnknownOwner != 0 || len(sh.Moves) != 0 {
		t.Errorf("shards = count %d, %d owners, owned %d, unowned %d, unknown %d, moves %v; want all %d owned",
			sh.Count, len(sh.Owner), sh.Owned, sh.Unowned, sh.UnknownOwner, sh.Moves, n)
	}
	if len(st.Kinds) != 1 || st.Kinds[0].Kind != "who" || st.Kinds[0].Messages != uint64(served["a"]) ||
		st.Kinds[0].Active != served["a"] || st.Self.Entities != served["a"] {
		t.Errorf("kinds = %+v, entities %d; want who with %d messages and %d active", st.Kinds, st.Self.Entities, served["a"], served["a"])
	}
	// The latest events, newest first: those the runner published (the
	// subscription delivers them asynchronously: wait until it caught up).
	var mismatch string
	matches := func() bool {
		evs := getState(t, nodes[0].srv.URL+"/?format=json&peers=0").Events
		all := nodes[0].rec.all()
		mismatch = ""
		if len(evs) != min(len(all), 100) {
			mismatch = fmt.Sprintf("%d events in the page, want the last %d of %d", len(evs), min(len(all), 100), len(all))
			return false
		}
		for i, ev := range evs {
			want := all[len(all)-1-i]
			if ev.Type != strings.TrimPrefix(fmt.Sprintf("%T", want), "runner.") || !ev.Time.Equal(want.Base().Time) {
				mismatch = fmt.Sprintf("event %d = %+v, want %T at %v", i, ev, want, want.Base().Time)
				return false
			}
		}
		return true
	}
	for p := testenv.NewPatience(5 * time.Second); !matches(); p.Sleep(10 * time.Millisecond) {
		if p.Over() {
			t.Fatalf("events after %v: %s", p, mismatch)
		}
	}
	// Without ?epochs=1 the map stays compact.
	if st := getState(t, nodes[0].srv.URL+"/?format=json"); st.Shards.Epoch != nil {
		t.Error("epochs listed without ?epochs=1")
	}
}

// TestDebugUnownedShards: a gateway's page shows the shards nobody owns
// and a lock held under a lease of no registered runner, each as such.
func TestDebugUnownedShards(t *testing.T) {
	const n = 16
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	gw := start(t, c, nil, runner.Config{ID: "gw", NumShards: n, ClientOnly: true, FullLockView: true})
	// A stray lock: a lease that no runner record names.
	l, err := c.NewStore("stray").Grant(t.Context(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	val, _ := storage.EncodeOwner(storage.Owner{RunnerID: "ghost", Incarnation: "x"})
	if _, err := c.Put(storage.LockKey(3), val, l.ID); err != nil {
		t.Fatal(err)
	}
	h := gw.DebugHandler(runner.DebugConfig{})
	var st runner.DebugState
	waitFor(t, 5*time.Second, "the gateway's view of the stray lock", func() bool {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/?format=json", nil))
		st = runner.DebugState{}
		return json.Unmarshal(rec.Body.Bytes(), &st) == nil && st.Shards.UnknownOwner == 1
	})
	if !st.Self.ClientOnly || st.Self.Lease != "" || st.Self.LeaseDeadlineLagMS != nil || len(st.Runners) != 0 {
		t.Errorf("gateway self = %+v, runners %v; want client-only without lease, no runner", st.Self, st.Runners)
	}
	if st.Shards.Unowned != n-1 || st.Shards.Owner[3] != runner.DebugUnknownOwner || st.Shards.Owner[0] != runner.DebugUnowned {
		t.Errorf("shards = %+v, want %d unowned and shard 3 under an unknown lease", st.Shards, n-1)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	cells := gridCells(t, parse(t, rec.Body.Bytes()))
	want := slices.Repeat([]string{"u"}, n)
	want[3] = "x"
	if !slices.Equal(cells, want) {
		t.Errorf("cells %v, want %v", cells, want)
	}
}

// TestDebugDetached: a detached runner reports it, with the reason, in
// the JSON and the page.
func TestDebugDetached(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, r, rec := startOwningAll(t, detachCfg("a"))
		h := r.DebugHandler(runner.DebugConfig{})
		r.store.Partition(true)
		d := waitDetached(t, rec, 20*time.Second)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?format=json", nil))
		var st runner.DebugState
		if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
			t.Fatal(err)
		}
		if st.Self.Attached || st.Self.Phase != "detached" || st.Self.Detached == nil ||
			st.Self.Detached.Reason != d.Reason.String() || st.Self.Owned != 0 {
			t.Errorf("self = %+v (detached %+v), want detached for %q, owning nothing", st.Self, st.Self.Detached, d.Reason)
		}
		if len(st.Events) == 0 || st.Events[0].Type != "Detached" {
			t.Errorf("latest event %+v, want Detached first", st.Events)
		}
		w = httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		doc := parse(t, w.Body.Bytes())
		self := byID(doc, "self")
		pills := find(self, func(c *html.Node) bool { return attr(c, "class") == "pill bad" })
		if len(pills) != 1 || pills[0].FirstChild.Data != "detached" {
			t.Errorf("no red 'detached' pill in #self")
		}
		r.store.Partition(false)
	})
}

// TestDebugLargeShardMap: at sharding.MaxShards shards the page still has
// one cell per shard, and stays small: compact cells (~20 bytes of HTML
// each), compressed on the wire; the JSON carries ~2 bytes per shard.
func TestDebugLargeShardMap(t *testing.T) {
	testenv.SkipIfShort(t, "owns 65 536 shards in real time")
	t.Parallel()
	n := sharding.MaxShards
	_, r, _ := startOwningAll(t, runner.Config{ID: "a", NumShards: n})
	srv := newServer(t, r.DebugHandler(runner.DebugConfig{}))
	// The runner owns every shard; its lock watch may still be catching up
	// with its own acquisitions, which the page draws from.
	var page []byte
	var cells []string
	allOurs := func() bool {
		page = get(t, srv.URL)
		cells = gridCells(t, parse(t, page))
		return len(cells) == n && !slices.ContainsFunc(cells, func(c string) bool { return c != "c0" })
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("a page of %d cells, all of owner c0", n), allOurs)
	if max := 21*n + 64<<10; len(page) > max {
		t.Errorf("page of %d shards is %d KB, want <= %d KB", n, len(page)>>10, max>>10)
	}
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	_, _ = zw.Write(page)
	_ = zw.Close()
	if zipped.Len() > 64<<10 {
		t.Errorf("page compresses to %d KB, want <= 64 KB", zipped.Len()>>10)
	}
	js := get(t, srv.URL+"?format=json")
	if max := 4*n + 64<<10; len(js) > max {
		t.Errorf("JSON is %d KB, want <= %d KB", len(js)>>10, max>>10)
	}
	t.Logf("%d shards: page %d KB (%d KB gzipped), JSON %d KB", n, len(page)>>10, zipped.Len()>>10, len(js)>>10)
}

// TestDebugBeforeRun: a runner that has not started shows as such, with
// every shard unowned.
func TestDebugBeforeRun(t *testing.T) {
	r, err := runner.New(memory.New(), runner.Config{ID: "idle", NumShards: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w := httptest.NewRecorder()
	r.DebugHandler(runner.DebugConfig{}).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?format=json", nil))
	var st runner.DebugState
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Self.Phase != "new" || st.Self.Attached || !st.Self.Started.IsZero() || len(st.Runners) != 0 ||
		st.Shards.Unowned != 8 || len(st.Events) != 0 {
		t.Errorf("state before Run = %+v", st)
	}
}

// TestDebugURLWithCredentialsIsRefused: a DebugURL carrying credentials
// would be published in the runner record and shown on every page: New
// refuses it, naming the fix, without repeating the password.
func TestDebugURLWithCredentialsIsRefused(t *testing.T) {
	s := memory.New()
	defer s.Cluster().Close()
	_, err := runner.New(s, runner.Config{ID: "a", DebugURL: "http://operator:s3cret@10.0.0.5:8081/debug/shardhost/"})
	if !errors.Is(err, runner.ErrInvalidConfig) || !strings.Contains(err.Error(), "DebugConfig.HTTPClient") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("New(DebugURL with user:password@) = %v, want ErrInvalidConfig naming DebugConfig.HTTPClient, without the password", err)
	}
	t.Logf("New: %v", err)
	if _, err := runner.New(s, runner.Config{ID: "a", DebugURL: "http://10.0.0.5:8081/debug/shardhost/"}); err != nil {
		t.Fatalf("New(DebugURL without credentials) = %v", err)
	}
}

// TestDebugForeignHandoff: a handoff record written by another process
// for one of a runner's shards is listed on the old owner's page with its
// source and target, and its cell is marked.
func TestDebugForeignHandoff(t *testing.T) {
	const n = 16
	nodes, _ := debugCluster(t, n, "a", "b")
	c := nodes[0].store.Cluster()
	// A third registration, of weight 0 (no shard is assigned to it), and
	// its warming handoff record for one of b's shards.
	l, err := c.NewStore("c").Grant(t.Context(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	recVal, err := storage.EncodeRunner(storage.RunnerRecord{ID: "c", Weight: 0, Incarnation: "ci", Started: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(storage.Key(storage.KeyspaceRunners, "c"), recVal, l.ID); err != nil {
		t.Fatal(err)
	}
	var shard sharding.ShardID
	for s := range nodes[1].Owned() {
		shard = s
		break
	}
	hoVal, err := storage.EncodeHandoff(storage.HandoffRecord{From: "b", To: "c", Phase: storage.HandoffWarming, ToIncarnation: "ci"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(storage.HandoffKey("b", shard), hoVal, l.ID); err != nil {
		t.Fatal(err)
	}
	url := nodes[1].srv.URL + "/"
	var st runner.DebugState
	waitFor(t, 5*time.Second, "b's view of the handoff record and of runner c", func() bool {
		st = getState(t, url+"?format=json&peers=0")
		return len(st.Handoffs) == 1 && st.Handoffs[0].To == "c"
	})
	if h := st.Handoffs[0]; h.Shard != shard || h.From != "b" || h.To != "c" || h.Phase != "warming" {
		t.Errorf("handoff in b's page = %+v, want shard %d b -> c, warming", h, shard)
	}
	cells := gridCells(t, parse(t, get(t, url+"?peers=0")))
	if want := fmt.Sprintf("c%d h", st.Shards.Owner[shard]); cells[shard] != want {
		t.Errorf("cell of shard %d = %q, want %q", shard, cells[shard], want)
	}
}
