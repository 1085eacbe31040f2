#!/usr/bin/env bash
# HTTP benchmark of sluice next to HAProxy and nginx, on loopback only.
#
# usage: bench/http.sh                 (knobs below as environment variables)
#
# Runs ../shared/peers/run.sh with sluice as the third system: wrk ->
# {HAProxy | nginx | sluice} -> the peers' two nginx backends on
# 127.0.0.1:18081 and :18082. run.sh pins every balancer alone on CPU0
# (LB_CPUS) and wrk plus the backends on CPU1 (GEN_CPUS), waits for a quiet
# machine before each point, repeats points disturbed by other processes,
# bounds every run and stops only what it started. Prints req/s, p50 and
# p99 per system and connection count, and sluice's ratios to HAProxy and
# nginx, and draws them into OUT with go run ./bench/plot: http.png (req/s),
# http-p99.png (p99) and http-cpu.png (balancer CPU per request).
#
# sluice runs as `sluice run` with its defaults (round robin, signed sticky
# cookie set on every new-work answer, X-Forwarded-For / Forwarded added,
# health checks every 2s) and GOMAXPROCS=$GMP.
#
# Knobs: GMP=1 (sluice's GOMAXPROCS) PORT=18095 (sluice's listen port)
#   SYSTEMS="http-haproxy http-nginx" (peers measured in the same run; add
#   http-direct or http-haproxy-sticky) SLUICE_FLAGS="" (extra flags)
#   ROUTES=0 (N > 0: sluice gets N -http-route lines in a -config file,
#   N-1 host and path routes that wrk's requests miss and, last, the one
#   that takes them (host=127.0.0.1), so every request walks the table to
#   its end: the cost of route selection with N routes)
#   PEERS=$ROOT/../shared/peers (the peers' harness)
#   OUT=$TMPDIR/sluice-bench/http-<timestamp>
#   and run.sh's own: DURATION=10 CONNS="50 200" PIN=1 LB_CPUS=0 GEN_CPUS=1 ...
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
GMP=${GMP:-1}
PORT=${PORT:-18095}
SYSTEMS=${SYSTEMS-"http-haproxy http-nginx"}
SLUICE_FLAGS=${SLUICE_FLAGS:-}
ROUTES=${ROUTES:-0}
PEERS=${PEERS:-$ROOT/../shared/peers}
OUT=${OUT:-${TMPDIR:-/tmp}/sluice-bench/http-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd -P)
BIN=$OUT/sluice

log() { echo "[$(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ -x "$PEERS/run.sh" ] || die "no $PEERS/run.sh"
for b in wrk haproxy nginx; do
    command -v "$b" >/dev/null || die "$b not installed (scripts/install-bench-deps.sh)"
done
log "building sluice into $BIN"
go build -o "$BIN" ./cmd/sluice || die "build failed"

if [ "$ROUTES" -gt 0 ]; then
    CONF=$OUT/routes.conf
    : > "$CONF"
    for i in $(seq 1 $((ROUTES - 1))); do
        if [ $((i % 2)) -eq 0 ]; then
            echo "http-route pool=default,host=h$i.example.com" >> "$CONF"
        else
            echo "http-route pool=default,path=/p$i/" >> "$CONF"
        fi
    done
    echo "http-route pool=default,host=127.0.0.1" >> "$CONF"
    SLUICE_FLAGS="-config $CONF $SLUICE_FLAGS"
    log "sluice: $ROUTES routes in $CONF, wrk's requests match the last"
fi

# wrk is one source address. sluice bounds what one source may hold: its
# client connections (-http-max-conns-per-source, an eighth of the client
# limit) and its requests holding a backend connection at once (an eighth of
# -http-backend-max-conns, 1024 by default: 128), answering 503 over them;
# HAProxy and nginx bound neither by default. Both are lifted far above the
# largest connection count measured (and the descriptor limit with them):
# without this, c200 measured sluice's fast "source limited" 503s, not its
# proxying (non2xx in the results).
ulimit -n 65536 2>/dev/null || log "WARNING: cannot raise the descriptor limit (ulimit -n $(ulimit -n))"
SLUICE_FLAGS="-http-backend-max-conns 65536 -http-max-conns-per-source 20000 $SLUICE_FLAGS"
export LB_HTTP_ADDR=127.0.0.1:$PORT
export LB_HTTP_CMD="exec env GOMAXPROCS=$GMP $BIN run -http-listen 127.0.0.1:$PORT \
-http-backend 127.0.0.1:18081 -http-backend 127.0.0.1:18082 -admin-listen '' \
-data-dir $OUT/data -log-level warn -drain-timeout 3s $SLUICE_FLAGS"
log "sluice: $LB_HTTP_CMD"
# shellcheck disable=SC2086
OUT=$OUT/peers "$PEERS/run.sh" $SYSTEMS http-target || die "run.sh failed"

RES=$OUT/peers/results.tsv
[ -s "$RES" ] || die "no results in $RES"
echo
echo "== sluice vs peers (GOMAXPROCS=$GMP; balancers pinned alone on CPU0, wrk and backends on CPU1; $RES)"
awk -F'\t' -v systems="$SYSTEMS http-target" '
    { v[$1, $2] = $3 }
    END {
        n = split(systems, sys, " ")
        split("50 200", conns, " ")
        printf "%-22s %6s %10s %8s %8s  %s\n", "system", "conns", "req/s", "p50 ms", "p99 ms", "errors"
        for (i = 1; i <= n; i++) for (j = 1; j <= 2; j++) {
            s = sys[i]; c = "c" conns[j]
            if ((s, c ".req_per_s") in v)
                printf "%-22s %6s %10s %8s %8s  %s\n", (s == "http-target" ? "sluice" : s), conns[j], v[s, c ".req_per_s"], v[s, c ".p50_ms"], v[s, c ".p99_ms"], v[s, c ".errors"]
        }
        print ""
        for (j = 1; j <= 2; j++) {
            c = "c" conns[j]; t = v["http-target", c ".req_per_s"]
            line = sprintf("c%-4s sluice req/s", conns[j])
            for (i = 1; i <= n; i++) {
                s = sys[i]; if (s == "http-target" || !((s, c ".req_per_s") in v) || v[s, c ".req_per_s"] + 0 == 0) continue
                line = line sprintf("  %.2fx %s (p99 %s vs %s ms)", t / v[s, c ".req_per_s"], s, v["http-target", c ".p99_ms"], v[s, c ".p99_ms"])
            }
            print line
        }
    }' "$RES"
echo
log "charts: go run ./bench/plot -in $OUT"
go run ./bench/plot -in "$OUT" || log "WARNING: no charts drawn (the results above stand; rerun: go run ./bench/plot -in $OUT)"
