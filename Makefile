# shardhost — developer commands. `make setup` once, then `make test`.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
TOOLS_DEPS := tools/go.mod tools/go.sum
# Built without -trimpath, at the versions examples/ builds (internal/layout checks them): the
# packages compiled here, etcd's server and the grpc, etcd client and otel under it, are those
# examples/ and the library's vet compile, so make test takes them from the build cache.
BUILD := cd tools && $(GO) build -ldflags='-s -w'

.PHONY: setup browser test test-short simulate faults vet fmt-check bench peers demo demo-partitions demo-carts demo-cluster demo-cluster-secure screenshots clean-bin

## setup: download Go modules, build the pinned etcd + toxiproxy binaries into ./bin, and install
## Debian's chromium for the browser checks when apt-get can (best effort, ~30 s once; never fails)
setup: $(BIN)/etcd $(BIN)/etcdctl $(BIN)/toxiproxy-server $(BIN)/toxiproxy-cli browser
	$(GO) mod download
	@if [ -f examples/go.mod ]; then cd examples && $(GO) mod download; fi
	@$(BIN)/etcd --version | head -1
	@$(BIN)/toxiproxy-server --version 2>&1 | head -1

## browser: install Chromium for the browser checks if missing (SHARDHOST_NO_BROWSER=1 skips)
browser:
	@scripts/install-chromium.sh

# etcd's and toxiproxy's main packages are all named "server": always give -o.
$(BIN)/etcd: $(TOOLS_DEPS)
	$(BUILD) -o $@ go.etcd.io/etcd/server/v3
$(BIN)/etcdctl: $(TOOLS_DEPS)
	$(BUILD) -o $@ go.etcd.io/etcd/etcdctl/v3
$(BIN)/toxiproxy-server: $(TOOLS_DEPS)
	$(BUILD) -o $@ github.com/Shopify/toxiproxy/v2/cmd/server
$(BIN)/toxiproxy-cli: $(TOOLS_DEPS)
	$(BUILD) -o $@ github.com/Shopify/toxiproxy/v2/cmd/cli

## test: vet and run the whole suite (needs `make setup`): everything under the race detector, the
## long proofs it would slow fivefold without it (kept there in a short version), then the examples
# scripts/test.sh says which step runs where and why:
# - The simulation: 50 seeds under -race (its default there), 1150 more (51..1200) without.
# - TestMovement, TestPlannerAtScale (arithmetic) and TestCommandsAtMaxShards (shardhostctl's
#   sequential commands at 65 536 shards): nothing for -race to find, without it only.
#   They and the simulation run beside the race step at nice 19, on the CPU its waiting tests leave idle.
# - examples/, beside the race step too: the demos embedding etcd run without -race (race-compiling
#   the etcd server costs ~70 CPU-s cold; the library they drive is race-tested); metrics, which
#   drives a runner in-process, runs with it too. Their tests build every main package.
# - The fault suite (one seed, nine faults, one of each kind): real processes whose timing -race
#   would distort: without it only, alone, last.
test:
	GO=$(GO) scripts/test.sh

## test-short: the quick loop for daily work (about a minute warm): go vet, then go test -short -shuffle=on in both
## modules: unit tests, the storage conformance suite on the memory store, 100 simulation seeds; no etcd,
## toxiproxy, runner processes or real-time waits (they skip under -short). `make test` is the whole proof.
test-short:
	$(GO) vet ./...
	$(GO) test -short -shuffle=on ./...
	@if [ -f examples/go.mod ]; then cd examples && $(GO) vet ./... && $(GO) test -short -shuffle=on ./...; fi

## simulate: the deterministic cluster simulation for SEEDS seeds (default 100000, about an hour on 2 cores)
SEEDS ?= 100000
simulate:
	$(GO) test -count=1 -timeout 6h -run '^TestSimulation$$' -v ./runner/ -sim.seeds=$(SEEDS) | tail -3

## faults: the randomized fault suite with real processes, RUNS runs (default 200, about 2 hours on 2 cores)
RUNS ?= 200
faults: $(BIN)/etcd $(BIN)/toxiproxy-server
	$(GO) run ./bench/faults -runs $(RUNS)

## bench: acquisition benchmarks on a real etcd, then the churn harness (~30 s; needs `make setup`; numbers in BENCHMARKS.md)
bench:
	$(GO) test -run '^$$' -bench . -benchtime 5x ./bench/
	$(GO) run ./bench/churn

## peers: shardhost side by side with protoactor-go, hollywood, goakt, ergo and the raw loopback TCP floor
## (bench/peers, a module of its own, not in `make test`: compiling the four frameworks costs ~140 CPU-s cold);
## its tests, then ROUNDS interleaved rounds (~1-2 min each on 2 cores) and the table; PEERS_ARGS adds flags (-json, -systems, -scenarios)
ROUNDS ?= 5
peers:
	cd bench/peers && $(GO) vet ./... && $(GO) test -count=1 ./... && $(GO) run . -rounds $(ROUNDS) $(PEERS_ARGS)

## demo: run the counter demo (embedded etcd, 3 runners + a gateway, graceful stop and crash; ~15 s)
demo:
	cd examples && $(GO) run ./counter

## demo-cluster: a real multi-process cluster: ./bin/etcd, 3 runner processes and a gateway, each with a
## debug page (http://127.0.0.1:8081/debug/shardhost/ ...); Ctrl-C stops it (see examples/README.md)
demo-cluster: $(BIN)/etcd $(BIN)/etcdctl
	examples/cluster/run.sh

## demo-cluster-secure: demo-cluster secured: etcd with client TLS and auth (a role per namespace, the
## gateway's reading only what it routes by), mutual TLS between the runners with RequireClusterPeers under
## a CA of its own (needs openssl; SECURITY.md)
demo-cluster-secure: $(BIN)/etcd $(BIN)/etcdctl
	SECURE=1 examples/cluster/run.sh

## screenshots: regenerate the pictures in docs/ (needs chromium: make browser)
screenshots:
	cd examples && SHARDHOST_SCREENSHOTS=$(CURDIR)/docs $(GO) test -count=1 -run '^(TestClusterProcesses|TestClusterTracesCrossProcesses)$$' ./cluster
	SHARDHOST_SCREENSHOTS=$(CURDIR)/docs $(GO) test -count=1 -run '^TestDebugPageInBrowser$$' ./runner
	$(GO) run ./bench/churn -duration 20s -seed 3 -html docs/churn-report.html > /dev/null
	chromium --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
		--disable-sync --no-first-run --hide-scrollbars --user-data-dir="$$(mktemp -d)" --window-size=1200,1500 \
		--screenshot=$(CURDIR)/docs/churn-report.png file://$(CURDIR)/docs/churn-report.html 2>/dev/null

## demo-carts: carts that expire after inactivity and a periodic summary: durable reminders and timers across a graceful stop and a crash (~15 s)
demo-carts:
	cd examples && $(GO) run ./carts

## demo-partitions: run the warming demo (log partitions as shards; scale-up 2 -> 3 with and without handoff; ~15 s)
demo-partitions:
	cd examples && $(GO) run ./partitions

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

clean-bin:
	rm -rf $(BIN)
