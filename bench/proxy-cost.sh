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
# HAProxy and the nginx backend run on CPU1. Each round starts both
# afresh (their cgroups swapped every other round) and loads both at once,
# each with its own client, DURATION s, so the machine's noise hits both
# alike (bench/http-ab.sh's way); every answer must be a 2xx, with no
# socket error; with connload a round whose two legs served more than 5 %
# apart (requests due while every worker was busy are not sent) is not
# counted. The figure is sluice's CPU
# time (utime + stime from /proc/PID/stat of its process tree, so the
# client's and HAProxy's costs do not count) divided by the requests
# completed; the ratio on ÷ off of each round, and its median and spread
# over ROUNDS rounds, are printed.
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

# lb ROLE SLOT: sluice ROLE (on: -proxy-protocol-from 127.0.0.1/32 on
# LB_ON; off: none, on LB_OFF) on CPU0 in cgroup SLOT (X or Y, each capped);
# sets LBPID (the `timeout` above sluice: its tree is sluice's).
lb() {
    local port=$LB_OFF procs flags=()
    [ "$1" = on ] && port=$LB_ON flags=(-proxy-protocol-from 127.0.0.1/32)
    procs=$(cgroup "$2")
    ( echo "$BASHPID" > "$procs"
      exec env GOMAXPROCS=1 taskset -c 0 timeout -k 5 3600 "$OUT/sluice" run -http-listen "127.0.0.1:$port" \
        -http-backend "127.0.0.1:$BE" -admin-listen '' -data-dir "$OUT/data-$1" -log-level warn \
        -drain-timeout 1s -http-backend-max-conns 65536 -http-max-conns-per-source 20000 "${flags[@]}" ) >> "$OUT/$1.log" 2>&1 &
    LBPID=$!
    PIDS+=("$LBPID")
}

# halt PID: stop one sluice (TERM to its `timeout`, which passes it on) and
# wait for it, so that its port is free for the next round.
halt() {
    kill -TERM "$1" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    local keep=() p
    for p in "${PIDS[@]}"; do [ "$p" != "$1" ] && keep+=("$p"); done
    PIDS=("${keep[@]}")
}

ready() {
    for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$1/" && return 0; sleep 0.1; done
    die "nothing answers on :$1 (logs in $OUT)"
}
ready "$BE"

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

# check NAME ROUND FILE: the requests of one run; dies on any failure.
check() {
    local f=$3 n late
    if [ "$CLIENT" = haproxy ]; then
        grep -qE "Non-2xx|Socket errors" "$f" && die "$1, round $2: wrk saw failures ($f): $(grep -E 'Non-2xx|Socket errors' "$f")"
        n=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$f")
    else
        grep -q " failed=0 " "$f" || die "$1, round $2: connload saw failures ($f): $(cat "$f")"
        n=$(sed -n 's/^requests=\([0-9]*\) .*/\1/p' "$f")
    fi
    [ "${n:-0}" -gt 0 ] || die "$1, round $2: no requests ($f)"
    echo "$n"
}

# Each round starts both sluices afresh, in swapped cgroups every other
# round (a slot a little faster than the other cancels out), and loads
# both at once, each with its own client: whatever slows the machine
# slows both, and the ratio of the round is the figure.
printf "%-6s %9s %9s %11s %11s %9s\n" round off_req on_req off_us/req on_us/req on/off
ratios=()
for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then so=X sf=Y; else so=Y sf=X; fi
    lb off "$sf"; pid_off=$LBPID
    lb on "$so"; pid_on=$LBPID
    ready "$LB_OFF"; ready "$HA_OFF"; ready "$HA_ON"
    # sluice "on" must have -proxy-protocol-from in force: a connection
    # from 127.0.0.1 without a header is refused.
    curl -s -m 2 -o /dev/null "http://127.0.0.1:$LB_ON/" &&
        die "sluice \"on\" answered a connection without a PROXY header: -proxy-protocol-from is not in force"
    load off 2 /dev/null & w1=$!
    load on 2 /dev/null & w2=$!
    wait "$w1" "$w2"
    o0=$(ticks "$pid_off"); n0=$(ticks "$pid_on")
    load off "$DURATION" "$OUT/off-$r.out" & w1=$!
    load on "$DURATION" "$OUT/on-$r.out" & w2=$!
    wait "$w1" "$w2"
    o1=$(ticks "$pid_off"); n1=$(ticks "$pid_on")
    halt "$pid_on"; halt "$pid_off"
    noff=$(check off "$r" "$OUT/off-$r.out") || exit 1
    non=$(check on "$r" "$OUT/on-$r.out") || exit 1
    [ $((o1 - o0)) -gt 0 ] && [ $((n1 - n0)) -gt 0 ] || die "round $r: a sluice used no CPU: is it the one answering?"
    if [ "$CLIENT" = connload ] && [ $((20 * (noff > non ? noff - non : non - noff))) -gt $((noff > non ? noff : non)) ]; then
        # CPU per request depends on the load: a round whose two loads
        # differ by more than 5 % (requests due while every worker of a
        # client was busy are not sent) compares two loads, not two
        # settings.
        log "round $r: off served $noff, on $non requests (over 5 % apart): not counted; lower RATE or raise CONNS"
        continue
    fi
    uoff=$(awk -v d="$((o1 - o0))" -v n="$noff" -v hz="$HZ" 'BEGIN { printf "%.1f", 1e6 * d / hz / n }')
    uon=$(awk -v d="$((n1 - n0))" -v n="$non" -v hz="$HZ" 'BEGIN { printf "%.1f", 1e6 * d / hz / n }')
    ratio=$(awk -v a="$uoff" -v b="$uon" 'BEGIN { printf "%.3f", b / a }')
    ratios+=("$ratio")
    printf "%-6s %9s %9s %11s %11s %9s\n" "$r" "$noff" "$non" "$uoff" "$uon" "$ratio"
done
[ ${#ratios[@]} -gt 0 ] || die "no round counted"
sorted=$(printf '%s\n' "${ratios[@]}" | sort -n)
median=$(echo "$sorted" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
echo "on/off sluice CPU per request: median $median over ${#ratios[@]} of $ROUNDS rounds, spread $(echo "$sorted" | head -1)..$(echo "$sorted" | tail -1) (client $CLIENT$([ "$CLIENT" = connload ] && echo ", $RATE/s each"), new connection per request, c$CONNS, each sluice capped at $LB_QUOTA % of CPU0; logs in $OUT)"
