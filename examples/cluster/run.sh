#!/usr/bin/env bash
# A real multi-process shardhost cluster on this machine (make demo-cluster):
# ./bin/etcd, three runner processes and a gateway that sends traffic, each
# serving the runner debug page on its own port. Ctrl-C stops everything
# (the runners gracefully). Logs and pid files are in $DEMO_DIR.
#
#   examples/cluster/run.sh                 start the cluster and wait (Ctrl-C stops it)
#   examples/cluster/run.sh start runner-2  start one runner again (after a kill -9), in
#                                           the background, from another terminal
#   TRACES=1 examples/cluster/run.sh        the same, each process exporting its OpenTelemetry spans to
#                                           $DEMO_DIR/spans-ID.jsonl (TRACES=otlp: to an OTLP collector at
#                                           $OTEL_EXPORTER_OTLP_ENDPOINT); draw one trace with
#                                           cd examples && go run ./cluster/waterfall -o trace.html $DEMO_DIR/spans-*.jsonl
#   SECURE=1 examples/cluster/run.sh        the same, secured (make demo-cluster-secure): etcd
#                                           with client TLS and auth, each process logged in
#                                           as a user whose role covers /demo/ only (the
#                                           gateway's: read on runners/ shards/ handoffs/
#                                           drains/ and cluster only), mutual TLS between the
#                                           runners with RequireClusterPeers. Two CAs: one for
#                                           etcd and its clients, one for the transport.
#                                           Certificates (openssl) and passwords in $DEMO_DIR/pki.
#
# Every process runs in a session of its own (setsid), so Ctrl-C reaches only
# this script, which stops the gateway and the runners first (SIGTERM: each
# hands its shards off and revokes its lease), then etcd.
#
# Environment: SECURE (0), TRACES (0; 1 or otlp), TRACE_RATIO (0.01), DEMO_DIR (default /tmp/shardhost-demo), ETCD_PORT (2379),
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
SECURE=${SECURE:-0}
TRACES=${TRACES:-0}
TRACE_RATIO=${TRACE_RATIO:-0.01}
PKI=$DEMO_DIR/pki

debug_url() { # debug_url INDEX (0: gateway)
	echo "http://127.0.0.1:$((DEBUG_PORT + $1))/debug/shardhost/"
}

# secure_args NAME USER: the flags of process NAME logged in to etcd as USER,
# with its certificate of the etcd CA for etcd and its certificate of the
# transport CA for the transport (nothing unless secured; a demo started with
# SECURE=1 leaves $PKI behind for `run.sh start`).
secure_args() {
	[ -f "$PKI/etcd/ca.pem" ] || return 0
	echo -cacert "$PKI/etcd/ca.pem" -cert "$PKI/etcd/$1.pem" -key "$PKI/etcd/$1-key.pem" -user "$2" \
		-tls-ca "$PKI/transport/ca.pem" -tls-cert "$PKI/transport/$1.pem" -tls-key "$PKI/transport/$1-key.pem" \
		-require-cluster-peers -client-peers gateway
}

# trace_args NAME: the tracing flags of process NAME (nothing unless TRACES
# is set: 1 for span files in $DEMO_DIR, otlp for an OTLP collector).
trace_args() {
	case "$TRACES" in
	0 | "") ;;
	otlp) echo -trace-exporter otlp -trace-ratio "$TRACE_RATIO" ;;
	*) echo -traces "$DEMO_DIR/spans-$1.jsonl" -trace-ratio "$TRACE_RATIO" ;;
	esac
}

# password USER: USER's etcd password ("" unless secured).
password() { cat "$PKI/$1.password" 2>/dev/null || true; }

# start_runner N: runner-N in the background, logging to $DEMO_DIR/runner-N.log.
start_runner() {
	local n=$1
	# shellcheck disable=SC2046 # secure_args and trace_args are words without spaces
	SHARDHOST_ETCD_PASSWORD=$(password shardhost-demo) setsid "$DEMO_DIR/bin/cluster" -role runner -id "runner-$n" \
		-etcd "127.0.0.1:$ETCD_PORT" -namespace "$NAMESPACE" \
		-listen "127.0.0.1:$((TRANSPORT_PORT + n))" -debug "127.0.0.1:$((DEBUG_PORT + n))" \
		-shards "$SHARDS" -ttl "$TTL" $(secure_args "runner-$n" shardhost-demo) $(trace_args "runner-$n") >>"$DEMO_DIR/runner-$n.log" 2>&1 &
	echo $! >"$DEMO_DIR/runner-$n.pid"
	echo "runner-$n: pid $!, $(debug_url "$n")"
}

# make_ca DIR LABEL: a CA in DIR (ca.pem, ca-key.pem).
make_ca() {
	mkdir -p "$1"
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=shardhost demo $2 CA" \
		-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign \
		-keyout "$1/ca-key.pem" -out "$1/ca.pem" 2>/dev/null
}

# issue DIR NAME: a certificate of DIR's CA for NAME (common name and DNS
# name: NAME; IP 127.0.0.1) in DIR/NAME.pem and DIR/NAME-key.pem.
issue() {
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$2" \
		-keyout "$1/$2-key.pem" -out "$1/$2.csr" 2>/dev/null
	printf 'subjectAltName=DNS:%s,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\n' "$2" >"$1/$2.ext"
	openssl x509 -req -in "$1/$2.csr" -CA "$1/ca.pem" -CAkey "$1/ca-key.pem" -CAcreateserial -days 2 \
		-extfile "$1/$2.ext" -out "$1/$2.pem" 2>/dev/null
	rm "$1/$2.csr" "$1/$2.ext"
}

# make_pki: two CAs, and random passwords, in $PKI. $PKI/etcd: etcd's server
# certificate and its clients' (one per process, shardhostctl and admin);
# $PKI/transport: the runners' and the gateway's transport certificates
# (DNS name: the process's ID). With --client-cert-auth etcd logs in, without
# a password, as the user a certificate of its CA names: a transport
# certificate must not be one (SECURITY.md).
make_pki() {
	mkdir -p "$PKI" && chmod 700 "$PKI"
	command -v openssl >/dev/null || { echo "SECURE=1 needs openssl" >&2; exit 1; }
	make_ca "$PKI/etcd" etcd
	make_ca "$PKI/transport" transport
	local name
	for name in etcd "${RUNNERS[@]}" gateway shardhostctl admin; do
		issue "$PKI/etcd" "$name"
	done
	for name in "${RUNNERS[@]}" gateway; do
		issue "$PKI/transport" "$name"
	done
	for name in root shardhost-demo shardhost-demo-gateway; do
		openssl rand -hex 16 >"$PKI/$name.password"
	done
	chmod 600 "$PKI"/*/*-key.pem "$PKI"/*.password
}

# etcdctl_admin ARGS: etcdctl against the demo's etcd with the admin
# certificate (before auth is enabled; root's password after).
etcdctl_admin() {
	"$BIN/etcdctl" --endpoints "https://127.0.0.1:$ETCD_PORT" --cacert "$PKI/etcd/ca.pem" --cert "$PKI/etcd/admin.pem" --key "$PKI/etcd/admin-key.pem" "$@"
}

# setup_auth: root, a readwrite role on /demo/ for the runners, a role for the
# gateway reading what a client-only runner reads and not the entities' state
# (the lines of SECURITY.md), then auth enable.
setup_auth() {
	etcdctl_admin user add root --new-user-password "$(password root)" >/dev/null
	etcdctl_admin user grant-role root root >/dev/null
	etcdctl_admin role add shardhost-demo >/dev/null
	etcdctl_admin role grant-permission shardhost-demo readwrite "/$NAMESPACE/" --prefix >/dev/null
	etcdctl_admin user add shardhost-demo --new-user-password "$(password shardhost-demo)" >/dev/null
	etcdctl_admin user grant-role shardhost-demo shardhost-demo >/dev/null
	etcdctl_admin role add shardhost-demo-gateway >/dev/null
	local ks
	for ks in runners/ shards/ handoffs/ drains/; do
		etcdctl_admin role grant-permission shardhost-demo-gateway read "/$NAMESPACE/$ks" --prefix >/dev/null
	done
	etcdctl_admin role grant-permission shardhost-demo-gateway read "/$NAMESPACE/cluster" >/dev/null
	etcdctl_admin user add shardhost-demo-gateway --new-user-password "$(password shardhost-demo-gateway)" >/dev/null
	etcdctl_admin user grant-role shardhost-demo-gateway shardhost-demo-gateway >/dev/null
	etcdctl_admin auth enable >/dev/null
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
etcd_tls=() scheme=http
health=("$BIN/etcdctl" --endpoints "127.0.0.1:$ETCD_PORT" endpoint health)
if [ "$SECURE" = 1 ]; then
	make_pki
	scheme=https
	etcd_tls=(--cert-file "$PKI/etcd/etcd.pem" --key-file "$PKI/etcd/etcd-key.pem" --trusted-ca-file "$PKI/etcd/ca.pem" --client-cert-auth)
	health=(etcdctl_admin endpoint health)
fi
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
	--listen-client-urls "$scheme://127.0.0.1:$ETCD_PORT" --advertise-client-urls "$scheme://127.0.0.1:$ETCD_PORT" \
	--listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
	--initial-cluster "demo=http://127.0.0.1:$((ETCD_PORT + 1))" "${etcd_tls[@]}" --log-level warn >"$DEMO_DIR/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
	"${health[@]}" >/dev/null 2>&1 && break
	sleep 0.1
done
"${health[@]}" >/dev/null 2>&1 || { echo "etcd did not start: see $DEMO_DIR/etcd.log" >&2; exit 1; }
echo "etcd: $scheme://127.0.0.1:$ETCD_PORT (pid ${pids[0]}, $BIN/etcd)"
if [ "$SECURE" = 1 ]; then
	setup_auth
	echo "etcd: client TLS and auth enabled; users shardhost-demo (readwrite /$NAMESPACE/) and" \
		"shardhost-demo-gateway (read /$NAMESPACE/{runners,shards,handoffs,drains}/ and cluster);" \
		"etcd CA $PKI/etcd, transport CA $PKI/transport; passwords in $PKI"
fi

for i in 1 2 3; do start_runner "$i"; done
# shellcheck disable=SC2046 # secure_args and trace_args are words without spaces
SHARDHOST_ETCD_PASSWORD=$(password shardhost-demo-gateway) setsid "$DEMO_DIR/bin/cluster" -role gateway -id gateway \
	-etcd "127.0.0.1:$ETCD_PORT" -namespace "$NAMESPACE" -debug "127.0.0.1:$DEBUG_PORT" -shards "$SHARDS" \
	-rate "$RATE" $(secure_args gateway shardhost-demo-gateway) $(trace_args gateway) >"$DEMO_DIR/gateway.log" 2>&1 &
echo $! >"$DEMO_DIR/gateway.pid"
echo "gateway: pid $!, $(debug_url 0)"

ctl="$DEMO_DIR/bin/shardhostctl -endpoints 127.0.0.1:$ETCD_PORT -namespace $NAMESPACE -shards $SHARDS"
if [ "$SECURE" = 1 ]; then
	ctl="SHARDHOST_ETCD_PASSWORD=\$(cat $PKI/shardhost-demo.password) $ctl -cacert $PKI/etcd/ca.pem -cert $PKI/etcd/shardhostctl.pem -key $PKI/etcd/shardhostctl-key.pem -user shardhost-demo"
fi
cat <<EOF

Open a dashboard: $(debug_url 1) (runner-1), or $(debug_url 0) (the gateway).
In another terminal:
  crash runner-2:     kill -9 \$(cat $DEMO_DIR/runner-2.pid)
  cluster status:     $ctl status
  start it again:     $0 start runner-2
  drain runner-1:     $ctl drain runner-1 -wait
  undrain it:         $ctl undrain runner-1
EOF
if [ "$TRACES" != 0 ] && [ "$TRACES" != otlp ]; then
	cat <<EOF
  draw a trace:       (cd $ROOT/examples && go run ./cluster/waterfall -o $DEMO_DIR/trace.html $DEMO_DIR/spans-*.jsonl)
                      (each process writes its spans every 5 s, and the rest as it stops)
EOF
fi
cat <<EOF
Ctrl-C here stops everything. The gateway's traffic:

EOF
tail -n +1 -F "$DEMO_DIR/gateway.log" &
pids+=($!)
wait "$(cat "$DEMO_DIR/gateway.pid")" || true
