package sharding

import (
	"errors"
	"slices"
	"testing"
)

// TestJumpReference compares jump with values of the reference C++ code of
// the paper (int32_t JumpConsistentHash(uint64_t key, int32_t num_buckets)).
func TestJumpReference(t *testing.T) {
	buckets := []int{1, 2, 3, 10, 100, 1000, 1024, 65536, 1 << 20, 1<<31 - 1}
	tests := []struct {
		key  uint64
		want []int
	}{
		{0, []int{0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{1, []int{0, 0, 0, 6, 55, 549, 549, 21134, 985611, 262355607}},
		{42, []int{0, 1, 2, 2, 43, 571, 571, 5747, 153897, 1603940301}},
		{256, []int{0, 1, 2, 3, 16, 520, 520, 8799, 86422, 74751002}},
		{0xdeadbeef, []int{0, 1, 2, 5, 87, 285, 285, 64244, 479362, 1452406526}},
		{0x0ddc0ffeebadf00d, []int{0, 1, 2, 2, 72, 113, 113, 47800, 86737, 848029737}},
		{0xffffffffffffffff, []int{0, 1, 2, 9, 92, 313, 313, 18311, 589430, 699554662}},
		{1234567890123456789, []int{0, 1, 2, 9, 96, 888, 888, 5233, 104880, 542643565}},
	}
	for _, tt := range tests {
		for i, b := range buckets {
			if got := jump(tt.key, b); got != tt.want[i] {
				t.Errorf("jump(%#x, %d) = %d, want %d", tt.key, b, got, tt.want[i])
			}
		}
	}
	// A full sweep for one key (also published with github.com/dgryski/go-jump).
	want := []int{0, 0, 0, 0, 0, 0, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 17, 17}
	for b := 1; b <= len(want); b++ {
		if got := jump(1, b); got != want[b-1] {
			t.Errorf("jump(1, %d) = %d, want %d", b, got, want[b-1])
		}
	}
}

func TestJumpHashOrdinals(t *testing.T) {
	tests := []struct {
		name    string
		runners []Runner
		want    *OrdinalError // nil: no error
	}{
		{"numbered", numbered("", 4), nil},
		{"mixed prefixes", []Runner{{"a-1", 1}, {"b-0", 1}, {"2", 1}}, nil},
		{"leading zeros", []Runner{{"r-00", 1}, {"r-01", 1}}, nil},
		{"drained without ordinal", []Runner{{"r-0", 1}, {"leaving", 0}}, nil},
		{"drained highest", []Runner{{"r-0", 1}, {"r-1", 1}, {"r-2", 0}}, nil},
		{"no ordinal", []Runner{{"r-0", 1}, {"r-x", 1}}, &OrdinalError{RunnerID: "r-x", Ordinal: -1, NumRunners: 2}},
		{"gap", []Runner{{"r-0", 1}, {"r-2", 1}}, &OrdinalError{RunnerID: "r-2", Ordinal: 2, NumRunners: 2}},
		{"drained middle", []Runner{{"r-0", 1}, {"r-1", 0}, {"r-2", 1}}, &OrdinalError{RunnerID: "r-2", Ordinal: 2, NumRunners: 2}},
		{"duplicate", []Runner{{"a-0", 1}, {"b-0", 1}}, &OrdinalError{RunnerID: "b-0", Ordinal: 0, NumRunners: 2, Other: "a-0"}},
		{"too big", []Runner{{"r-0", 1}, {"r-99999999999999999999999", 1}}, &OrdinalError{RunnerID: "r-99999999999999999999999", Ordinal: -1, NumRunners: 2}},
	}
	for _, tt := range tests {
		_, err := JumpHash().Assign(Input{NumShards: 64, Runners: tt.runners})
		var got *OrdinalError
		switch {
		case tt.want == nil && err != nil:
			t.Errorf("JumpHash().Assign(%s %v) error: %v", tt.name, tt.runners, err)
		case tt.want == nil:
		case !errors.As(err, &got) || !errors.Is(err, ErrBadOrdinal):
			t.Errorf("JumpHash().Assign(%s %v) = %v, want %v", tt.name, tt.runners, err, tt.want)
		case *got != *tt.want:
			t.Errorf("JumpHash().Assign(%s %v) error = %+v, want %+v", tt.name, tt.runners, *got, *tt.want)
		}
	}
}

func TestOrdinalErrorMessages(t *testing.T) {
	tests := []struct {
		err  *OrdinalError
		want string
	}{
		{&OrdinalError{RunnerID: "r-x", Ordinal: -1, NumRunners: 2}, `sharding: bad runner ordinal: runner "r-x": ID does not end in a decimal ordinal`},
		{&OrdinalError{RunnerID: "r-5", Ordinal: 5, NumRunners: 2}, `sharding: bad runner ordinal: runner "r-5": ordinal 5 out of range 0..1`},
		{&OrdinalError{RunnerID: "b-0", Ordinal: 0, NumRunners: 2, Other: "a-0"}, `sharding: bad runner ordinal: runners "a-0" and "b-0" both have ordinal 0`},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("%+v.Error() = %q, want %q", *tt.err, got, tt.want)
		}
	}
}

// TestJumpHashMapping checks that JumpHash maps shard s to the runner whose
// ordinal is jump(hash(s), M), whatever the weights and prefixes.
func TestJumpHashMapping(t *testing.T) {
	rs := []Runner{{"z-2", 1}, {"a-0", 5}, {"m-1", 100}, {"q-3", 1}}
	byOrdinal := []string{"a-0", "m-1", "z-2", "q-3"}
	got := mustAssign(t, JumpHash(), Input{NumShards: 1000, Runners: rs})
	want := make(Assignment, 1000)
	for s := range want {
		want[s] = byOrdinal[jump(shardKey(s), 4)]
	}
	if !slices.Equal(got, want) {
		t.Errorf("JumpHash().Assign(%v) differs from jump() at shards %v", rs, Diff(got, want))
	}
}
