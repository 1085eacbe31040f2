#!/usr/bin/env bash
# What the PROXY protocol v2 costs sluice per new HTTP connection: sluice's
# own CPU time per request, header on against header off, a new connection
# for every request, on loopback only.
#
# usage: bench/proxy-cost.sh
#
#   CLIENT=connload (default): bench/connload -> sluice -> nginx
#   CLIENT=haproxy:            wrk -H 'Connection: close' -> HAProxy (mode tcp) -> sluice -> nginx
#
# Two sluice instances run side by side, both pinned to CPU0, each in its
# own CPU cgroup capped at LB_QUOTA % of that core: "on" with
# -proxy-protocol-from 127.0.0.1/32, whose every connection starts with a
# v2 header, "off" without it, whose connections start with none. With
# connload the header comes from the client itself, in the same write as
# the request, at a fixed rate (RATE new connections a second) for both:
# CPU per request depends on the load (fewer wake-ups serve more requests
# at a higher rate), so both must carry the same one. With haproxy, the
# header comes from an HAProxy server line with send-proxy-v2 (a plain
# `mode tcp` line for off) and wrk runs flat out: the setting of the issue,
# but the two legs' rates differ with the machine's noise. The client,
# HAProxy and the nginx backend run on CPU1. Each round loads off and on one
# after the other (which goes first alternates), DURATION s each; every
# answer must be a 2xx, with no socket error (and, for connload, every
# request sent on time). The figure is sluice's CPU time (utime + stime
# from /proc/PID/stat of its process tree, so the client's and HAProxy's
# costs do not count) divided by the requests completed; the ratio on ÷ off
# of each round, and its median and spread over ROUNDS rounds, are printed.
#
# Knobs: CLIENT=connload|haproxy RATE=1500 (connload) CONNS=50 (wrk's and
#   connload's concurrent connections) LB_QUOTA=50 (% of CPU0 per instance)
#   DURATION=10 ROUNDS=5
#   PORT_BASE=18300 (PORT_BASE+0..4 are used: nginx, the two sluices, the
#   two HAProxy frontends)
#   OUT=$TMPDIR/sluice-bench/proxy-<timestamp>
# Every process it starts runs under `timeout` and is stopped by its PID.
set -u
cd "$(dirname "$0")/.." || exit 1
CLIENT=${CLIENT:-connload}
RATE=${RATE:-1500}
LB_QUOTA=${LB_QUOTA:-50}
CONNS=${CONNS:-50}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-5}
PORT_BASE=${PORT_BASE:-18300}
OUT=${OUT:-${TMPDIR:-/tmp}/sluice-bench/proxy-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd -P)
HZ=$(getconf CLK_TCK)
BE=$PORT_BASE LB_ON=$((PORT_BASE + 1)) LB_OFF=$((PORT_BASE + 2)) HA_ON=$((PORT_BASE + 3)) HA_OFF=$((PORT_BASE + 4))

log() { echo "[$(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

case $LB_QUOTA in '' | *[!0-9]*) die "LB_QUOTA=$LB_QUOTA: want a whole percentage of one core, 1..50" ;; esac
[ "$LB_QUOTA" -ge 1 ] && [ $((2 * LB_QUOTA)) -le 100 ] || die "LB_QUOTA=$LB_QUOTA: two instances share CPU0, want 1..50"
case $CLIENT in connload | haproxy) ;; *) die "CLIENT=$CLIENT: want connload or haproxy" ;; esac
for k in RATE CONNS DURATION ROUNDS PORT_BASE; do
    v=${!k}
    case $v in '' | *[!0-9]*) die "$k=$v: want a positive whole number" ;; esac
    [ "$v" -ge 1 ] || die "$k=$v: want a positive whole number"
done
for b in wrk nginx haproxy taskset timeout curl ss; do command -v "$b" >/dev/null || die "$b not installed"; done
for p in "$BE" "$LB_ON" "$LB_OFF" "$HA_ON" "$HA_OFF"; do
    ss -Hltn "sport = :$p" | grep -q . && die "port $p is in use (another run?): set PORT_BASE"
done

# Each PID is a `timeout`, which passes TERM on to its program; sluice
# drains for its -drain-timeout (1 s) first, so KILL comes only after 5 s
# (timeout -k 5 kills its program then too).
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    PIDS=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ulimit -n 65536 2>/dev/null

log "building sluice and connload into $OUT"
go build -o "$OUT/sluice" ./cmd/sluice || die "build failed"
go build -o "$OUT/connload" ./bench/connload || die "build failed"

# cgroup NAME: a CPU cgroup capped at LB_QUOTA % of one core over 10 ms
# periods (v2 cpu.max, else v1 cfs quota); prints its procs file.
cgroup() {
    local g
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        g=/sys/fs/cgroup/sluice-proxy-$1
        mkdir -p "$g" && echo "$((LB_QUOTA * 100)) 10000" > "$g/cpu.max" || die "cannot cap $g"
    else
        g=/sys/fs/cgroup/cpu/sluice-proxy-$1
        mkdir -p "$g" && echo 10000 > "$g/cpu.cfs_period_us" && echo "$((LB_QUOTA * 100))" > "$g/cpu.cfs_quota_us" \
            || die "cannot cap $g"
    fi
    echo "$g/cgroup.procs"
}

# The backend: one nginx worker answering 200 on CPU1.
mkdir -p "$OUT/nginx/logs" "$OUT/nginx/tmp"
cat > "$OUT/nginx.conf" <<EOF
worker_processes 1;
worker_rlimit_nofile 65536;
pid nginx.pid;
error_log logs/error.log warn;
events { worker_connections 16384; use epoll; }
http {
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 60s;
    client_body_temp_path tmp/body; proxy_temp_path tmp/proxy; fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi; scgi_temp_path tmp/scgi;
    server { listen 127.0.0.1:$BE backlog=4096; location / { return 200 "b1\n"; } }
}
EOF
taskset -c 1 timeout -k 5 3600 nginx -p "$OUT/nginx" -c "$OUT/nginx.conf" -g 'daemon off;' > "$OUT/nginx.log" 2>&1 &
PIDS+=($!)

# HAProxy in TCP mode, one frontend per sluice: send-proxy-v2 to "on".
cat > "$OUT/haproxy.cfg" <<EOF
global
    maxconn 8000
defaults
    mode tcp
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend on
    bind 127.0.0.1:$HA_ON
    default_backend on
backend on
    server s 127.0.0.1:$LB_ON send-proxy-v2
frontend off
    bind 127.0.0.1:$HA_OFF
    default_backend off
backend off
    server s 127.0.0.1:$LB_OFF
EOF
taskset -c 1 timeout -k 5 3600 haproxy -db -f "$OUT/haproxy.cfg" > "$OUT/haproxy.log" 2>&1 &
PIDS+=($!)

# lb NAME PORT FLAGS...: one sluice on CPU0 in its own capped cgroup;
# sets LBPID (the `timeout` above sluice: its tree is sluice's).
lb() {
    local name=$1 port=$2 procs
    shift 2
    procs=$(cgroup "$name")
    ( echo "$BASHPID" > "$procs"
      exec env GOMAXPROCS=1 taskset -c 0 timeout -k 5 3600 "$OUT/sluice" run -http-listen "127.0.0.1:$port" \
        -http-backend "127.0.0.1:$BE" -admin-listen '' -data-dir "$OUT/data-$name" -log-level warn \
        -drain-timeout 1s -http-backend-max-conns 65536 -http-max-conns-per-source 20000 "$@" ) >> "$OUT/$name.log" 2>&1 &
    LBPID=$!
    PIDS+=("$LBPID")
}
lb off "$LB_OFF"
PID_OFF=$LBPID
lb on "$LB_ON" -proxy-protocol-from 127.0.0.1/32
PID_ON=$LBPID

ready() {
    for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$1/" && return 0; sleep 0.1; done
    die "nothing answers on :$1 (logs in $OUT)"
}
ready "$BE"; ready "$HA_OFF"; ready "$HA_ON"
# Through HAProxy "on", sluice must have read the header: a request
# straight to its port (no header, from a source that must send one) is
# refused.
if curl -s -m 2 -o /dev/null "http://127.0.0.1:$LB_ON/"; then
    die "sluice \"on\" answered a connection without a PROXY header: -proxy-protocol-from is not in force"
fi

# ticks ROOTPID: utime + stime (clock ticks) of ROOTPID's process tree.
ticks() {
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v root="$1" '
        { p = index($0, ") "); split(substr($0, p + 2), a, " "); parent[$1] = a[2]; t[$1] = a[12] + a[13] }
        END { for (pid in t) { q = pid; while (q != "" && q != 0 && q != root) q = parent[q]; if (q == root) s += t[pid] }
              print s + 0 }'
}

# load NAME SECONDS OUTFILE: the client's run against sluice NAME (on, off).
load() {
    local ha=$HA_OFF lb=$LB_OFF proxy=none
    [ "$1" = on ] && ha=$HA_ON lb=$LB_ON proxy=v2
    if [ "$CLIENT" = haproxy ]; then
        taskset -c 1 timeout $(($2 + 30)) wrk -t1 -c"$CONNS" -d"${2}s" --timeout 5s \
            -H 'Connection: close' "http://127.0.0.1:$ha/" > "$3" 2>&1
    else
        taskset -c 1 timeout $(($2 + 30)) "$OUT/connload" -addr "127.0.0.1:$lb" -proxy "$proxy" \
            -rate "$RATE" -conns "$CONNS" -duration "${2}s" > "$3" 2>&1
    fi
}

# leg NAME LBPID ROUND: one run; prints "requests cpu_seconds", or dies
# on any failure.
leg() {
    local f="$OUT/$1-$3.out" t0 t1 n
    t0=$(ticks "$2")
    load "$1" "$DURATION" "$f"
    t1=$(ticks "$2")
    if [ "$CLIENT" = haproxy ]; then
        grep -qE "Non-2xx|Socket errors" "$f" && die "$1, round $3: wrk saw failures ($f): $(grep -E 'Non-2xx|Socket errors' "$f")"
        n=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$f")
    else
        grep -q "failed=0 late=0 " "$f" || die "$1, round $3: connload failed or could not hold $RATE/s ($f): $(cat "$f")"
        n=$(sed -n 's/^requests=\([0-9]*\) .*/\1/p' "$f")
    fi
    [ "${n:-0}" -gt 0 ] || die "$1, round $3: no requests ($f)"
    [ $((t1 - t0)) -gt 0 ] || die "$1, round $3: sluice (pid $2) used no CPU: is it the one answering?"
    echo "$n $(awk -v d="$((t1 - t0))" -v hz="$HZ" 'BEGIN { printf "%.2f", d / hz }')"
}

# warm-up: a short run each, not counted
for name in off on; do load "$name" 2 /dev/null; done

printf "%-6s %9s %9s %11s %11s %9s\n" round off_req on_req off_us/req on_us/req on/off
ratios=()
for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then
        read -r noff coff <<< "$(leg off "$PID_OFF" "$r")"
        read -r non con <<< "$(leg on "$PID_ON" "$r")"
    else
        read -r non con <<< "$(leg on "$PID_ON" "$r")"
        read -r noff coff <<< "$(leg off "$PID_OFF" "$r")"
    fi
    [ -n "${noff:-}" ] && [ -n "${non:-}" ] || die "round $r: a leg failed (see $OUT)"
    uoff=$(awk -v c="$coff" -v n="$noff" 'BEGIN { printf "%.1f", 1e6 * c / n }')
    uon=$(awk -v c="$con" -v n="$non" 'BEGIN { printf "%.1f", 1e6 * c / n }')
    ratio=$(awk -v a="$uoff" -v b="$uon" 'BEGIN { printf "%.3f", b / a }')
    ratios+=("$ratio")
    printf "%-6s %9s %9s %11s %11s %9s\n" "$r" "$noff" "$non" "$uoff" "$uon" "$ratio"
done
sorted=$(printf '%s\n' "${ratios[@]}" | sort -n)
median=$(echo "$sorted" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
echo "on/off sluice CPU per request: median $median over $ROUNDS rounds, spread $(echo "$sorted" | head -1)..$(echo "$sorted" | tail -1) (client $CLIENT$([ "$CLIENT" = connload ] && echo ", $RATE/s"), new connection per request, c$CONNS, each sluice capped at $LB_QUOTA % of CPU0; logs in $OUT)"
