#!/usr/bin/env bash
# The whole test suite (`make test`; GO names the go command). Every step
# must pass; the script exits non-zero when one does not.
#
# The steps and why they run where they do:
#   1. go vet, root module. Its checks include those go test runs before a
#      package's tests, so the go test steps below pass -vet=off (they would
#      vet every package again, and examples/ once more).
#   2. Under -race, every root package (runner first: its real-etcd tests
#      wait in real time and are the longest package, so it starts as soon as
#      it is compiled).
#      Beside it, in the background (their output is printed after step 2):
#      the deterministic proofs that -race would slow fivefold — the
#      simulation's other 1 150 seeds (virtual time inside testing/synctest:
#      the load of step 2 cannot change their outcome), TestMovement and
#      TestPlannerAtScale (arithmetic) and TestCommandsAtMaxShards
#      (shardhostctl's sequential commands at 65 536 shards) — then
#      examples/: vet, its tests (the demos' processes) and metrics under
#      -race. The steps that only compute (all but examples/' tests, which
#      run processes with lease TTLs) run at the lowest CPU priority (nice
#      19): they take the CPU step 2's waiting tests leave idle and never
#      hold back a test whose runners must renew a lease or answer in time.
#   3. The fault suite (one seed, nine faults, one of each kind), real
#      processes, without -race, alone: its timing is part of what it
#      checks.
#
# The whole run collects garbage at GOGC=400 unless GOGC is set: the
# compiler, vet and the tests spend about a fifth less CPU (a cold
# compile of transport/ and its dependencies under -race: 44 CPU-s at the
# default, 35 at 400) for more memory (its largest compile process:
# 0.24 -> 0.37 GB). The tests that bound a heap pin their collector to the
# default while they measure (hostilepeer.StartWatch). Test binaries are
# linked without DWARF (-ldflags=-w; stack traces and race reports do not
# use it): about a quarter less CPU per link.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
export GOGC=${GOGC:-400}
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-ldflags=-w"

log=$(mktemp -d "${TMPDIR:-/tmp}/shardhost-test.XXXXXX")
trap 'rm -rf "$log"' EXIT

# cpu prints the CPU seconds (user + system) that the waited-for children of
# the shell with PID $1 used so far: cutime + cstime of /proc/$1/stat.
cpu() {
	awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); printf "%d", ($14 + $15) / hz }' "/proc/$1/stat"
}

step() {
	echo "== $*"
	local t0=$SECONDS self=$BASHPID c0 rc
	c0=$(cpu "$self")
	"$@"
	rc=$?
	echo "   ($((SECONDS - t0)) s wall, $(($(cpu "$self") - c0)) CPU-s)"
	return "$rc"
}

step "$GO" vet ./... || exit 1

# The background steps stop at the first failure; their log is printed whole.
(
	set -e
	step nice -n 19 "$GO" test -vet=off -count=1 -timeout 10m -run '^TestSimulation$' ./runner/ -sim.seeds=1150 -sim.first=51
	step nice -n 19 "$GO" test -vet=off -count=1 -timeout 5m -run '^(TestMovement|TestPlannerAtScale)$' ./sharding/
	step nice -n 19 "$GO" test -vet=off -count=1 -timeout 5m -run '^TestCommandsAtMaxShards$' ./cmd/shardhostctl/
	if [ -f examples/go.mod ]; then
		cd examples
		step nice -n 19 "$GO" vet ./...
		step "$GO" test -vet=off -timeout 10m ./...
		step "$GO" test -vet=off -race -timeout 5m ./metrics/
	fi
) >"$log/background" 2>&1 &
bg=$!

# In a subshell: its CPU figure counts the race step alone (the shell
# counts a background step's CPU when it reaps it, whenever it ends).
(step "$GO" test -vet=off -race -shuffle=on -parallel 6 -timeout 20m ./runner/ ./...)
race=$?

wait "$bg"
background=$?
echo "== (ran beside the race step) the simulation's other seeds, TestMovement, examples/"
cat "$log/background"
if [ "$race" -ne 0 ] || [ "$background" -ne 0 ]; then
	echo "FAIL: the race step exited $race, the steps beside it $background"
	exit 1
fi

step "$GO" test -vet=off -count=1 -timeout 10m -run '^TestRandomizedFaultsKeepEveryGuarantee$' ./bench/faults/ || exit 1
echo "== make test: every step passed ($SECONDS s wall, $(cpu "$$") CPU-s)"
