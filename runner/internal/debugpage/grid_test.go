package debugpage

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// maxShardsSnapshot is a view of sharding.MaxShards shards over 100
// runners (runner-000 under lease 1 ... runner-099 under lease 100), each
// shard locked by its balanced assignee except: shard 7 unowned, shard 8
// under a lease of no runner, shard 9 in a warming handoff, and shard 10
// locked by another runner than its assignee.
func maxShardsSnapshot(t *testing.T) Snapshot {
	t.Helper()
	const m = 100
	n := sharding.MaxShards
	s := Snapshot{ID: "runner-000", Incarnation: "runner-000-inc", NumShards: n, Strategy: "balanced", Weight: 1,
		Phase: "attached", Attached: true, Started: t0.Add(-time.Minute), Lease: 1, LeaseTTL: 15 * time.Second,
		LeaseDeadline: t0.Add(10 * time.Second), ByLease: map[storage.LeaseID]string{}}
	in := sharding.Input{NumShards: n}
	lease := map[string]storage.LeaseID{}
	for i := range m {
		id := fmt.Sprintf("runner-%03d", i)
		s.Members = append(s.Members, member(id, storage.LeaseID(i+1)))
		s.ByLease[storage.LeaseID(i+1)] = id
		lease[id] = storage.LeaseID(i + 1)
		in.Runners = append(in.Runners, sharding.Runner{ID: id, Weight: 1})
	}
	a, err := sharding.Balanced().Assign(in)
	if err != nil {
		t.Fatal(err)
	}
	s.Assignment = a
	for sh, id := range a {
		l := storage.Lock{Shard: sharding.ShardID(sh), Lease: lease[id], Epoch: storage.Epoch(1000 + sh)}
		switch sh {
		case 7:
			continue
		case 8:
			l.Lease = 999
		case 10:
			l.Lease = lease[id]%m + 1 // the next runner's
		}
		s.Locks = append(s.Locks, l)
	}
	s.Handoffs = []storage.Handoff{{Shard: 9, Lease: lease[a[9]]%m + 1,
		HandoffRecord: storage.HandoffRecord{From: a[9], To: s.ByLease[lease[a[9]]%m+1], Phase: storage.HandoffWarming}}}
	return s
}

var gridCell = regexp.MustCompile(`<i class="([^"]*)"></i>`)

// TestGridOfMaxShards: a page of sharding.MaxShards shards over 100
// runners has one cell per shard, each naming its owner (or unowned, or an
// unknown lease) and its handoff or move, in cells small enough for the
// map to fit a screen, and stays within ~20 bytes per shard of HTML before
// gzip (~2 after).
func TestGridOfMaxShards(t *testing.T) {
	s := maxShardsSnapshot(t)
	n := s.NumShards
	start := time.Now()
	st := build(s, t0, false, &rateSampler{})
	var page bytes.Buffer
	if err := render(&page, st, Config{}.withDefaults(), false); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)

	_, grid, ok := strings.Cut(page.String(), `<div id="grid"`)
	grid, _, _ = strings.Cut(grid, "</div>")
	if !ok {
		t.Fatal("no #grid in the page")
	}
	cells := gridCell.FindAllStringSubmatch(grid, -1)
	if len(cells) != n {
		t.Fatalf("%d cells in the grid, want one per shard (%d)", len(cells), n)
	}
	index := map[string]int{}
	for i, r := range st.Runners {
		index[r.ID] = i
	}
	for sh, c := range cells {
		classes := strings.Fields(c[1])
		want := "c" + fmt.Sprint(index[s.Assignment[sh]])
		switch sh {
		case 7:
			want = "u"
		case 8:
			want = "x"
		case 10:
			want = "c" + fmt.Sprint((index[s.Assignment[sh]]+1)%len(st.Runners))
		}
		if classes[0] != want {
			t.Fatalf("cell %d has classes %q, want owner class %s", sh, c[1], want)
		}
		if (sh == 9) != strings.Contains(c[1], " h") || (sh == 8 || sh == 7 || sh == 10) != strings.Contains(c[1], " m") {
			t.Errorf("cell %d has classes %q: want h on shard 9 (handoff) only, m on 7, 8 and 10 (not where assigned) only", sh, c[1])
		}
	}

	px := cellSize(n)
	if side := int(math.Ceil(math.Sqrt(float64(n)))) * (px + 1); side > 1024 {
		t.Errorf("cells of %d px: a square map of %d shards is %d px wide, want <= 1024", px, n, side)
	}
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	_, _ = zw.Write(page.Bytes())
	_ = zw.Close()
	if max := 21*n + 64<<10; page.Len() > max {
		t.Errorf("page of %d shards is %d KB, want <= %d KB", n, page.Len()>>10, max>>10)
	}
	if max := 2*n + 32<<10; zipped.Len() > max {
		t.Errorf("page of %d shards compresses to %d KB, want <= %d KB", n, zipped.Len()>>10, max>>10)
	}
	t.Logf("%d shards, %d runners: page %d KB (%d KB gzipped), cells of %d px, built and rendered in %v",
		n, len(st.Runners), page.Len()>>10, zipped.Len()>>10, px, took.Round(time.Millisecond))
}
