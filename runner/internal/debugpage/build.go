package debugpage

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// build returns the State of snapshot s taken at now, with the shard
// epochs when epochs is set; rates turns its counters into rates. The
// peers' own states (Runner.URL, State, StateError) are left to fill in.
func build(s Snapshot, now time.Time, epochs bool, rates *rateSampler) *State {
	st := &State{Schema: Schema, Time: now, Self: self(s, now)}
	st.Kinds = kinds(&st.Self, s.Kinds, now, rates)
	st.Runners = runners(s.Members, s.ID)
	st.Shards = shardMap(s, st.Runners, epochs)
	if i := slices.IndexFunc(st.Runners, func(r Runner) bool { return r.Self }); i >= 0 {
		st.Self.Assigned = st.Runners[i].Assigned
	}
	st.Handoffs = handoffs(s, st.Runners, st.Shards.Owner)
	st.Workers = make([]Worker, 0, len(s.Workers))
	for _, w := range s.Workers {
		st.Workers = append(st.Workers, Worker(w))
	}
	slices.SortFunc(st.Workers, func(a, b Worker) int {
		if a.Name != b.Name {
			return strings.Compare(a.Name, b.Name)
		}
		return int(a.Shard) - int(b.Shard)
	})
	st.Remembered = make([]ShardCount, 0, len(s.Remembered))
	for id, n := range s.Remembered {
		st.Remembered = append(st.Remembered, ShardCount{Shard: id, Count: n})
	}
	slices.SortFunc(st.Remembered, func(a, b ShardCount) int { return int(a.Shard) - int(b.Shard) })
	st.Events = slices.Clip(s.Events[:min(len(s.Events), MaxEvents)])
	if st.Events == nil {
		st.Events = []Event{}
	}
	return st
}

// self is the runner's own state in s, without its message counters
// (kinds) and its assigned shards (shardMap).
func self(s Snapshot, now time.Time) Self {
	out := Self{
		ID: s.ID, Incarnation: s.Incarnation, Address: s.Address, ClientOnly: s.ClientOnly,
		Phase: s.Phase, Attached: s.Attached, Detached: s.Detached, NotStarted: s.NotStarted, Started: s.Started,
		DetachMarginMS: ms(s.DetachMargin), NumShards: s.NumShards, Strategy: s.Strategy,
		Weight: s.Weight, Owned: s.Owned, Pending: s.Pending, Releasing: s.Releasing,
		InboundHandoffs: s.InboundHandoffs, KeepAliveFailureStreak: s.KeepAliveFailureStreak,
		Entities: s.Entities, AssignmentError: s.AssignmentError,
	}
	if g := s.Gateway; g != nil {
		out.Gateway = &GatewayView{Ready: g.Ready, Reason: g.Reason, Members: g.Members, Routes: g.Routes}
	}
	if s.Lease != storage.NoLease && !s.ClientOnly {
		out.Lease = fmt.Sprintf("%x", s.Lease)
		out.LeaseTTLMS = ms(s.LeaseTTL)
		lag := ms(s.LeaseDeadline.Sub(now))
		out.LeaseDeadlineLagMS = &lag
	}
	return out
}

// kinds returns the kinds' counters and rates, and adds their totals to
// self.
func kinds(self *Self, counts []KindCount, now time.Time, rates *rateSampler) []Kind {
	for _, k := range counts {
		self.Messages += k.Handled
		self.MailboxRejections += k.Rejected
	}
	r := rates.update(now, counters(counts))
	if rate, ok := r["total"]; ok {
		self.MessagesPerSec = &rate
	}
	out := make([]Kind, 0, len(counts))
	for _, k := range counts {
		dk := Kind{Kind: k.Name, Active: k.Active, Messages: k.Handled, MailboxRejections: k.Rejected}
		if rate, ok := r["kind:"+k.Name]; ok {
			dk.MessagesPerSec = &rate
		}
		out = append(out, dk)
	}
	return out
}

// runners returns the registered runners in the order of members, with
// their colours; selfID is the serving runner's.
func runners(members []storage.Runner, selfID string) []Runner {
	out := make([]Runner, 0, len(members))
	ids := make([]string, 0, len(members))
	for _, m := range members {
		out = append(out, Runner{
			ID: m.ID, Address: m.Address, Weight: m.Weight, Incarnation: m.Incarnation, Draining: m.Draining,
			Started: m.Started, Lease: fmt.Sprintf("%x", m.Lease), Self: m.ID == selfID, URL: m.DebugURL,
		})
		ids = append(ids, m.ID)
	}
	for i, c := range runnerColors(ids) {
		out[i].Color = c
	}
	return out
}

// shardMap returns the shard map of s: each shard's owner (an index into
// runners, whose Owned and Assigned it counts), and the shards whose lock
// is not where the assignment wants it.
func shardMap(s Snapshot, runners []Runner, epochs bool) Shards {
	index := make(map[string]int, len(runners))
	for i, r := range runners {
		index[r.ID] = i
	}
	n := s.NumShards
	sh := Shards{Count: n, Owner: make([]int, n), Moves: []Move{}}
	if epochs {
		sh.Epoch = make([]int64, n)
	}
	for i := range sh.Owner {
		sh.Owner[i] = Unowned
	}
	for _, l := range s.Locks {
		if int(l.Shard) >= n {
			continue
		}
		id, live := s.ByLease[l.Lease]
		if i, listed := index[id]; live && listed {
			sh.Owner[l.Shard] = i
			runners[i].Owned++
		} else {
			sh.Owner[l.Shard] = UnknownOwner
		}
		if epochs {
			sh.Epoch[l.Shard] = int64(l.Epoch)
		}
	}
	for shard, o := range sh.Owner {
		switch o {
		case Unowned:
			sh.Unowned++
		case UnknownOwner:
			sh.UnknownOwner++
		default:
			sh.Owned++
		}
		if shard >= len(s.Assignment) || s.Assignment[shard] == "" {
			continue
		}
		to := s.Assignment[shard]
		if i, ok := index[to]; ok {
			runners[i].Assigned++
		}
		if o < 0 || runners[o].ID != to {
			mv := Move{Shard: sharding.ShardID(shard), To: to}
			if o >= 0 {
				mv.From = runners[o].ID
			}
			sh.Moves = append(sh.Moves, mv)
		}
	}
	return sh
}

// handoffs returns the handoff records of s. A record between two other
// runners is not decoded (its From and To are empty): its target is named
// by the record's lease, its source by the shard's owner.
func handoffs(s Snapshot, runners []Runner, owner []int) []Handoff {
	out := make([]Handoff, 0, len(s.Handoffs))
	for _, ho := range s.Handoffs {
		h := Handoff{Shard: ho.Shard, From: ho.From, To: ho.To, Phase: string(ho.Phase)}
		if h.To == "" {
			h.To = s.ByLease[ho.Lease]
			if int(ho.Shard) < len(owner) && owner[ho.Shard] >= 0 {
				h.From = runners[owner[ho.Shard]].ID
			}
		}
		out = append(out, h)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// palette holds well-separated colours (no red: red marks unowned shards)
// for the first runners of a shard map.
var palette = []string{
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
	taken := make([]bool, len(palette))
	for i, id := range ids {
		f := fnv.New32a()
		_, _ = f.Write([]byte(id))
		x := f.Sum32()
		if i >= len(palette) {
			out[i] = fmt.Sprintf("hsl(%d 55%% %d%%)", x%360, 40+x/360%3*10)
			continue
		}
		slot := int(x % uint32(len(palette)))
		for taken[slot] {
			slot = (slot + 1) % len(palette)
		}
		taken[slot] = true
		out[i] = palette[slot]
	}
	return out
}

// rateSampler turns counters into rates over the interval between two
// samples at least rateInterval apart — the handler's creation (baseline)
// and its requests; requests in between reuse the last rates.
type rateSampler struct {
	mu     sync.Mutex
	at     time.Time
	counts map[string]uint64
	rates  map[string]float64
}

const rateInterval = time.Second

// counters returns the counters of a snapshot's kinds, by the keys the
// sampler uses: "kind:<name>" and "total".
func counters(counts []KindCount) map[string]uint64 {
	out := make(map[string]uint64, len(counts)+1)
	var total uint64
	for _, k := range counts {
		out["kind:"+k.Name] = k.Handled
		total += k.Handled
	}
	out["total"] = total
	return out
}

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
