#!/usr/bin/env bash
# Two sluice configurations (or builds) measured at the same time, on
# loopback only: the ratio of their throughputs with the machine's noise
# taken out.
#
# usage: A_FLAGS="..." B_FLAGS="..." bench/http-ab.sh
#        A_BIN=/path/old-sluice B_BIN=/path/new-sluice bench/http-ab.sh
#
# On a shared 2-core machine the same build varies by ±30 % from one
# sequential run to the next (bench/RESULTS.md), so a sequential A/B cannot
# show a 3 % difference. Here A and B run side by side: both pinned to CPU0,
# each in its own CPU cgroup capped at QUOTA % of that core (they never
# compete for it: 2 × QUOTA ≤ 100), each driven by its own wrk, both wrk and
# the peers' two nginx backends on CPU1. Whatever slows the machine slows
# both; the ratio B/A of each round is the figure, and the median over
# ROUNDS rounds is printed.
#
# Knobs: QUOTA=25 (% of CPU0 per instance) CONNS=50 DURATION=10 ROUNDS=5
#   TLS=1: wrk speaks keep-alive HTTPS to both instances' -https-listen
#   (an ECDSA P-256 certificate made by openssl into OUT, the handshake
#   bounds lifted as bench/https.sh lifts them); TLS=0 (default): plain HTTP
#   A_FLAGS / B_FLAGS (extra flags of `sluice run` for A and B)
#   A_NGINX / B_NGINX: run nginx as that slot's balancer instead of sluice
#   (the peers' nginx-lb.conf on the slot's port, one worker): "off" without
#   an access log, "json" with one JSON line per request to OUT/nginx-SLOT.log
#   (the fields of sluice's JSON line that nginx has: time, client, method,
#   host, path, protocol, status, bytes in and out, upstream, request and
#   upstream times, request id, user agent, referer), each line written at
#   once as nginx does by default; "jsonbuf" the same through a 64 KiB
#   buffer flushed every second (`buffer=64k flush=1s`; sluice's writer
#   writes up to 64 KiB at once); plain HTTP only.
#   `A_NGINX=off B_NGINX=json bench/http-ab.sh` is nginx's access-log cost
#   measured as sluice's is.
#   A_BIN / B_BIN (default: this tree, built once)
#   PEERS=$ROOT/../shared/peers (for the nginx backends' configuration)
#   OUT=$TMPDIR/sluice-bench/ab-<timestamp>
# Every process it starts runs under `timeout` and is stopped by its PID.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
QUOTA=${QUOTA:-25}
CONNS=${CONNS:-50}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-5}
TLS=${TLS:-0}
A_NGINX=${A_NGINX:-}
B_NGINX=${B_NGINX:-}
A_FLAGS=${A_FLAGS:-}
B_FLAGS=${B_FLAGS:-}
PEERS=${PEERS:-$ROOT/../shared/peers}
OUT=${OUT:-${TMPDIR:-/tmp}/sluice-bench/ab-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd -P)

log() { echo "[$(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ $((2 * QUOTA)) -le 100 ] || die "QUOTA=$QUOTA: two instances share CPU0, at most 50 each"
case $TLS in 0|1) ;; *) die "TLS=$TLS: want 0 (plain HTTP) or 1 (HTTPS)" ;; esac
for v in "$A_NGINX" "$B_NGINX"; do
    case $v in "") ;; off|json|jsonbuf) [ "$TLS" = 0 ] || die "A_NGINX/B_NGINX: plain HTTP only (TLS=0)" ;;
    *) die "A_NGINX/B_NGINX=$v: want off (no access log), json or jsonbuf" ;; esac
done
for b in wrk nginx taskset timeout; do command -v "$b" >/dev/null || die "$b not installed"; done
if { [ -z "${A_BIN:-}" ] && [ -z "$A_NGINX" ]; } || { [ -z "${B_BIN:-}" ] && [ -z "$B_NGINX" ]; }; then
    log "building sluice into $OUT/sluice"
    go build -o "$OUT/sluice" ./cmd/sluice || die "build failed"
fi
A_BIN=${A_BIN:-$OUT/sluice}
TLS_FLAGS=""
if [ "$TLS" = 1 ]; then
    command -v openssl >/dev/null || die "openssl not installed"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=localhost \
        -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -keyout "$OUT/key.pem" -out "$OUT/crt.pem" \
        2> "$OUT/openssl.log" || die "openssl failed (see $OUT/openssl.log)"
    cat "$OUT/crt.pem" "$OUT/key.pem" > "$OUT/cert.pem"
    TLS_FLAGS="-tls-cert $OUT/cert.pem -tls-handshake-rate 0 -tls-handshakes-max 4096"
fi
B_BIN=${B_BIN:-$OUT/sluice}

# cgroup NAME: a CPU cgroup capped at QUOTA % of one core over 10 ms periods
# (v2 cpu.max, else v1 cfs quota), named after this script's PID so that two
# runs at once do not share one; prints its procs file.
cgroup() {
    local g
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        g=/sys/fs/cgroup/sluice-ab-$$-$1
        mkdir -p "$g" && echo "$((QUOTA * 100)) 10000" > "$g/cpu.max" || die "cannot cap $g"
    else
        g=/sys/fs/cgroup/cpu/sluice-ab-$$-$1
        mkdir -p "$g" && echo 10000 > "$g/cpu.cfs_period_us" && echo "$((QUOTA * 100))" > "$g/cpu.cfs_quota_us" \
            || die "cannot cap $g"
    fi
    echo "$g/cgroup.procs"
}

PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    sleep 0.5
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    PIDS=()
    rmdir /sys/fs/cgroup/sluice-ab-$$-[XY] /sys/fs/cgroup/cpu/sluice-ab-$$-[XY] 2>/dev/null
}
trap cleanup EXIT

# The backends: the peers' nginx on :18081 and :18082, on CPU1.
mkdir -p "$OUT/nginx/logs" "$OUT/nginx/tmp"
taskset -c 1 timeout -k 5 3600 nginx -p "$OUT/nginx" -c "$PEERS/conf/nginx-backend.conf" -g 'daemon off;' \
    > "$OUT/nginx.log" 2>&1 &
PIDS+=($!)
ulimit -n 65536 2>/dev/null

# tlsflags PORT: with TLS=1, the HTTPS listener of the instance on PORT
# (at PORT+1000) and its certificate.
tlsflags() { [ "$TLS" = 1 ] && echo "-https-listen 127.0.0.1:$(($1 + 1000)) $TLS_FLAGS"; }
# url PORT: what wrk asks of the instance on PORT.
url() { if [ "$TLS" = 1 ]; then echo "https://127.0.0.1:$(($1 + 1000))/"; else echo "http://127.0.0.1:$1/"; fi; }

# nginxconf PORT MODE: the peers' nginx-lb.conf listening on PORT, with the
# access log MODE (off, json, jsonbuf) in OUT/nginx-PORT.log; prints its directory.
nginxconf() {
    local d="$OUT/nginx-lb-$1" alog="access_log off;"
    mkdir -p "$d/logs" "$d/tmp"
    if [ "$2" != off ]; then
        alog="log_format sluicejson escape=json '{\"time\":\"\$time_iso8601\",\"log\":\"http\",\"client\":\"\$remote_addr:\$remote_port\",\"method\":\"\$request_method\",\"host\":\"\$host\",\"path\":\"\$uri\",\"protocol\":\"\$server_protocol\",\"status\":\$status,\"bytes_in\":\$request_length,\"bytes_out\":\$bytes_sent,\"backend\":\"\$upstream_addr\",\"t_connect_ms\":\"\$upstream_connect_time\",\"t_first_byte_ms\":\"\$upstream_header_time\",\"t_total_ms\":\"\$request_time\",\"request_id\":\"\$request_id\",\"user_agent\":\"\$http_user_agent\",\"referer\":\"\$http_referer\"}'; access_log $OUT/nginx-$1.log sluicejson$( [ "$2" = jsonbuf ] && echo " buffer=64k flush=1s");"
    fi
    sed -e "s/listen 127.0.0.1:18090/listen 127.0.0.1:$1/" -e "s#access_log off;#$alog#" \
        "$PEERS/conf/nginx-lb.conf" > "$d/nginx.conf"
    echo "$d"
}

# lb SLOT BIN PORT FLAGS [NGINX]: one sluice (or, with NGINX off or json,
# nginx) on CPU0 in the slot's own capped cgroup.
lb() {
    local procs d
    procs=$(cgroup "$1")
    if [ -n "${5:-}" ]; then
        d=$(nginxconf "$3" "$5")
        ( echo "$BASHPID" > "$procs"
          exec taskset -c 0 timeout -k 5 3600 nginx -p "$d" -c "$d/nginx.conf" -g 'daemon off;' ) >> "$OUT/$1.log" 2>&1 &
        LBPIDS+=($!)
        return
    fi
    # shellcheck disable=SC2086
    ( echo "$BASHPID" > "$procs"
      exec env GOMAXPROCS=1 taskset -c 0 timeout -k 5 3600 "$2" run -http-listen "127.0.0.1:$3" \
        -http-backend 127.0.0.1:18081 -http-backend 127.0.0.1:18082 -admin-listen '' \
        -data-dir "$OUT/data-$1" -log-level warn -drain-timeout 1s \
        -http-backend-max-conns 65536 -http-max-conns-per-source 20000 $(tlsflags "$3") $4 ) >> "$OUT/$1.log" 2>&1 &
    LBPIDS+=($!)
}
ready() {
    for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$1/" && return 0; sleep 0.1; done
    die "nothing answers on :$1 (logs in $OUT)"
}
ready 18081; ready 18082
if [ -n "$A_NGINX" ]; then log "A: nginx, access log $A_NGINX"; else log "A: $A_BIN $A_FLAGS"; fi
if [ -n "$B_NGINX" ]; then log "B: nginx, access log $B_NGINX"; else log "B: $B_BIN $B_FLAGS"; fi

# rps FILE: wrk's requests per second, 0 with any error or non-2xx answer.
rps() {
    if grep -qE "Non-2xx|Socket errors" "$1"; then echo 0; return; fi
    awk '/^Requests\/sec:/ { print $2 }' "$1"
}

# ticks PID: CPU time (user + system, clock ticks) of what the `timeout` of
# PID runs: sluice, or nginx's master and worker.
ticks() {
    local p ps=() t=0
    for p in $(pgrep -P "$1"); do ps+=("$p" $(pgrep -P "$p")); done
    for p in "${ps[@]}"; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0))); done
    echo "$t"
}
# requests FILE: how many requests wrk completed.
requests() { awk '/ requests in / { print $1 }' "$1"; }
# median: of the numbers on stdin.
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# Each round starts A and B afresh, in swapped slots (cgroup, port, which
# wrk starts first) every other round: a slot that runs a little faster
# than the other (measured: 2-3 % with one build in both) cancels out.
# Besides req/s, each instance's CPU time per request during the measured
# run (from /proc, 10 ms ticks): when wrk's core is the bottleneck (TLS,
# a busy machine) req/s hardly tells the builds apart, CPU per request
# still does.
hz=$(getconf CLK_TCK)
printf "%-6s %10s %10s %8s %9s %9s %8s\n" round A_req/s B_req/s B/A A_us/req B_us/req B/A_cpu
ratios=() cratios=()
for r in $(seq "$ROUNDS"); do
    LBPIDS=()
    if [ $((r % 2)) -eq 1 ]; then pa=18096 pb=18097 sa=X sb=Y; else pa=18097 pb=18096 sa=Y sb=X; fi
    lb "$sa" "$A_BIN" "$pa" "$A_FLAGS" "$A_NGINX"
    lb "$sb" "$B_BIN" "$pb" "$B_FLAGS" "$B_NGINX"
    PIDS+=("${LBPIDS[@]}")
    ready "$pa"; ready "$pb"
    warm=()
    for port in "$pa" "$pb"; do
        taskset -c 1 timeout 20 wrk -t1 -c"$CONNS" -d2s "$(url "$port")" >/dev/null 2>&1 &
        warm+=($!)
    done
    wait "${warm[@]}"
    ta0=$(ticks "${LBPIDS[0]}"); tb0=$(ticks "${LBPIDS[1]}")
    taskset -c 1 timeout 60 wrk -t1 -c"$CONNS" -d"${DURATION}s" "$(url "$pa")" > "$OUT/A-$r.wrk" 2>&1 &
    wa=$!
    taskset -c 1 timeout 60 wrk -t1 -c"$CONNS" -d"${DURATION}s" "$(url "$pb")" > "$OUT/B-$r.wrk" 2>&1 &
    wb=$!
    wait "$wa" "$wb"
    ta=$(($(ticks "${LBPIDS[0]}") - ta0)); tb=$(($(ticks "${LBPIDS[1]}") - tb0))
    for p in "${LBPIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${LBPIDS[@]}"; do wait "$p" 2>/dev/null; done
    a=$(rps "$OUT/A-$r.wrk"); b=$(rps "$OUT/B-$r.wrk")
    if [ "${a%.*}" -gt 0 ] 2>/dev/null && [ "${b%.*}" -gt 0 ] 2>/dev/null; then
        ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')
        ratios+=("$ratio")
        ua=$(awk -v t="$ta" -v n="$(requests "$OUT/A-$r.wrk")" -v hz="$hz" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
        ub=$(awk -v t="$tb" -v n="$(requests "$OUT/B-$r.wrk")" -v hz="$hz" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
        cratio=$(awk -v a="$ua" -v b="$ub" 'BEGIN { if (a > 0) printf "%.3f", b / a; else print "-" }')
        [ "$cratio" != - ] && cratios+=("$cratio")
    else
        ratio="errors (see $OUT/[AB]-$r.wrk)" ua=- ub=- cratio=-
    fi
    printf "%-6s %10s %10s %8s %9s %9s %8s\n" "$r" "$a" "$b" "$ratio" "$ua" "$ub" "$cratio"
done
[ ${#ratios[@]} -gt 0 ] || die "no clean round"
median=$(printf '%s\n' "${ratios[@]}" | median)
cmedian=$(printf '%s\n' "${cratios[@]}" | median)
echo "median B/A over ${#ratios[@]} clean rounds: $median (c$CONNS, $( [ "$TLS" = 1 ] && echo HTTPS || echo HTTP ), each instance capped at $QUOTA % of CPU0)"
echo "median B/A of CPU per request: ${cmedian:--}"
