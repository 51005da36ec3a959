#!/usr/bin/env bash
# A real multi-process shardhost cluster on this machine (make demo-cluster):
# ./bin/etcd, three runner processes and a gateway that sends traffic, each
# serving the runner debug page on its own port. Ctrl-C stops everything
# (the runners gracefully). Logs and pid files are in $DEMO_DIR.
#
#   examples/cluster/run.sh                 start the cluster and wait (Ctrl-C stops it)
#   examples/cluster/run.sh start runner-2  start one runner again (after a kill -9), in
#                                           the background, from another terminal
#
# Every process runs in a session of its own (setsid), so Ctrl-C reaches only
# this script, which stops the gateway and the runners first (SIGTERM: each
# hands its shards off and revokes its lease), then etcd.
#
# Environment: DEMO_DIR (default /tmp/shardhost-demo), ETCD_PORT (2379),
# DEBUG_PORT (8080: gateway; runners DEBUG_PORT+1..3), TRANSPORT_PORT (7100:
# runners TRANSPORT_PORT+1..3), SHARDS (1024), TTL (5s), RATE (500 asks/s).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${SHARDHOST_BIN:-$ROOT/bin}
DEMO_DIR=${DEMO_DIR:-/tmp/shardhost-demo}
ETCD_PORT=${ETCD_PORT:-2379}
DEBUG_PORT=${DEBUG_PORT:-8080}
TRANSPORT_PORT=${TRANSPORT_PORT:-7100}
SHARDS=${SHARDS:-1024}
TTL=${TTL:-5s}
RATE=${RATE:-500}
NAMESPACE=demo
RUNNERS=(runner-1 runner-2 runner-3)

debug_url() { # debug_url INDEX (0: gateway)
	echo "http://127.0.0.1:$((DEBUG_PORT + $1))/debug/shardhost/"
}

# start_runner N: runner-N in the background, logging to $DEMO_DIR/runner-N.log.
start_runner() {
	local n=$1
	setsid "$DEMO_DIR/bin/cluster" -role runner -id "runner-$n" -etcd "127.0.0.1:$ETCD_PORT" -namespace "$NAMESPACE" \
		-listen "127.0.0.1:$((TRANSPORT_PORT + n))" -debug "127.0.0.1:$((DEBUG_PORT + n))" \
		-shards "$SHARDS" -ttl "$TTL" >>"$DEMO_DIR/runner-$n.log" 2>&1 &
	echo $! >"$DEMO_DIR/runner-$n.pid"
	echo "runner-$n: pid $!, $(debug_url "$n")"
}

if [ "${1:-}" = start ]; then
	id=${2:?usage: run.sh start runner-N}
	n=${id#runner-}
	[ -x "$DEMO_DIR/bin/cluster" ] || { echo "no demo in $DEMO_DIR: run $0 first" >&2; exit 1; }
	if kill -0 "$(cat "$DEMO_DIR/$id.pid" 2>/dev/null)" 2>/dev/null; then
		echo "$id is running (pid $(cat "$DEMO_DIR/$id.pid"))" >&2
		exit 1
	fi
	start_runner "$n"
	exit 0
fi

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if [ ! -x "$BIN/etcd" ] || [ ! -x "$BIN/etcdctl" ]; then
	echo "no $BIN/etcd: run \`make setup\` in $ROOT first" >&2
	exit 1
fi
for p in "$ETCD_PORT" $((ETCD_PORT + 1)) "$DEBUG_PORT" $((DEBUG_PORT + 1)) $((DEBUG_PORT + 2)) $((DEBUG_PORT + 3)) \
	$((TRANSPORT_PORT + 1)) $((TRANSPORT_PORT + 2)) $((TRANSPORT_PORT + 3)); do
	if port_busy "$p"; then
		echo "port $p on 127.0.0.1 is in use (another demo? an etcd?): stop it, or set ETCD_PORT / DEBUG_PORT / TRANSPORT_PORT" >&2
		exit 1
	fi
done

rm -rf "$DEMO_DIR"
mkdir -p "$DEMO_DIR/bin"
echo "building examples/cluster and cmd/shardhostctl into $DEMO_DIR/bin ..."
(cd "$ROOT/examples" && go build -o "$DEMO_DIR/bin/cluster" ./cluster)
(cd "$ROOT" && go build -o "$DEMO_DIR/bin/shardhostctl" ./cmd/shardhostctl)

pids=()
cleanup() {
	trap - EXIT INT TERM
	echo
	echo "stopping the gateway and the runners (gracefully), then etcd ..."
	local f pid
	for f in "$DEMO_DIR"/gateway.pid "$DEMO_DIR"/runner-*.pid; do
		[ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true
	done
	for f in "$DEMO_DIR"/gateway.pid "$DEMO_DIR"/runner-*.pid; do
		[ -f "$f" ] || continue
		pid=$(cat "$f")
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		kill -KILL "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	echo "done (logs in $DEMO_DIR)"
}
trap cleanup EXIT INT TERM

setsid "$BIN/etcd" --name demo --data-dir "$DEMO_DIR/etcd" \
	--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
	--listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
	--initial-cluster "demo=http://127.0.0.1:$((ETCD_PORT + 1))" --log-level warn >"$DEMO_DIR/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
	"$BIN/etcdctl" --endpoints "127.0.0.1:$ETCD_PORT" endpoint health >/dev/null 2>&1 && break
	sleep 0.1
done
"$BIN/etcdctl" --endpoints "127.0.0.1:$ETCD_PORT" endpoint health >/dev/null 2>&1 || { echo "etcd did not start: see $DEMO_DIR/etcd.log" >&2; exit 1; }
echo "etcd: 127.0.0.1:$ETCD_PORT (pid ${pids[0]}, $BIN/etcd)"

for i in 1 2 3; do start_runner "$i"; done
setsid "$DEMO_DIR/bin/cluster" -role gateway -id gateway -etcd "127.0.0.1:$ETCD_PORT" -namespace "$NAMESPACE" \
	-debug "127.0.0.1:$DEBUG_PORT" -shards "$SHARDS" -rate "$RATE" >"$DEMO_DIR/gateway.log" 2>&1 &
echo $! >"$DEMO_DIR/gateway.pid"
echo "gateway: pid $!, $(debug_url 0)"

ctl="$DEMO_DIR/bin/shardhostctl -endpoints 127.0.0.1:$ETCD_PORT -namespace $NAMESPACE -shards $SHARDS"
cat <<EOF

Open a dashboard: $(debug_url 1) (runner-1), or $(debug_url 0) (the gateway).
In another terminal:
  crash runner-2:     kill -9 \$(cat $DEMO_DIR/runner-2.pid)
  cluster status:     $ctl status
  start it again:     $0 start runner-2
  drain runner-1:     $ctl drain runner-1 -wait
  undrain it:         $ctl undrain runner-1
Ctrl-C here stops everything. The gateway's traffic:

EOF
tail -n +1 -F "$DEMO_DIR/gateway.log" &
pids+=($!)
wait "$(cat "$DEMO_DIR/gateway.pid")" || true
