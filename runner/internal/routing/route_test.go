package routing

import (
	"testing"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// viewDir is a Directory whose view of the shard's owner and of the
// members a test sets.
type viewDir struct {
	dir
	owner   string // "" no owner
	members map[string]string
}

func (d *viewDir) Route(sharding.ShardID) (storage.Runner, bool) {
	if d.owner == "" {
		return storage.Runner{}, false
	}
	return d.Member(d.owner)
}

func (d *viewDir) Member(id string) (storage.Runner, bool) {
	addr, ok := d.members[id]
	return storage.Runner{RunnerRecord: storage.RunnerRecord{ID: id, Address: addr}}, ok
}

// TestCallRouteCurrent: a remote attempt's wait for a connection stays
// current while routing would still send there — the watch's owner at the
// same address, or, for an attempt sent to a NotOwner hint, the watch's
// view unchanged and the hinted runner still a member at that address —
// and not when the owner is gone, moved, or readdressed.
func TestCallRouteCurrent(t *testing.T) {
	for _, tc := range []struct {
		name         string
		routed, dest string // at the attempt
		owner        string // the watch's owner now
		members      map[string]string
		want         bool
	}{
		{"owner unchanged", "a", "a", "a", map[string]string{"a": "a:1", "b": "b:1"}, true},
		{"lock moved to b", "a", "a", "b", map[string]string{"a": "a:1", "b": "b:1"}, false},
		{"lock deleted", "a", "a", "", map[string]string{"a": "a:1", "b": "b:1"}, false},
		{"owner's record gone", "a", "a", "a", map[string]string{"b": "b:1"}, false},
		{"owner readdressed (a restart)", "a", "a", "a", map[string]string{"a": "a:2"}, false},
		{"hint, watch unchanged", "a", "b", "a", map[string]string{"a": "a:1", "b": "b:1"}, true},
		{"hint, watch had no owner and still has none", "", "b", "", map[string]string{"b": "b:1"}, true},
		{"hint, watch now names another", "a", "b", "c", map[string]string{"a": "a:1", "b": "b:1", "c": "c:1"}, false},
		{"hint, hinted runner gone", "a", "b", "a", map[string]string{"a": "a:1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &viewDir{owner: tc.owner, members: tc.members}
			rt := &callRoute{r: &Router{dir: d}, id: 1, routed: tc.routed}
			rt.dest.ID, rt.dest.Address = tc.dest, tc.dest+":1"
			if got := rt.Current(); got != tc.want {
				t.Errorf("Current() = %v, want %v", got, tc.want)
			}
		})
	}
}
