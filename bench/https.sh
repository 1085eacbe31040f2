#!/usr/bin/env bash
# HTTPS and HTTP/2 benchmark of sluice next to HAProxy and nginx, each
# terminating TLS, on loopback only.
#
# usage: bench/https.sh                (knobs below as environment variables)
#        DURATION=3 ROUNDS=1 QUIET_MAX=5 bench/https.sh     (a smoke run)
#        unshare -n sh -c 'ip link set lo up && bench/https.sh'
#             (as root, in a network namespace of its own: no port taken by
#             another run on the machine, none taken from it)
#
#   wrk / h2load -> {HAProxy | nginx | sluice} over TLS -> the peers' two plain
#   nginx backends on 127.0.0.1:18081 and :18082 ($PEERS/conf/nginx-backend.conf)
#
# The shape of bench/http.sh (every balancer alone on CPU LB_CPUS, capped at
# LB_QUOTA % of it by a CPU cgroup; wrk -t1, h2load -t1 and the backends on
# GEN_CPUS; results.tsv; sluice's ratios to the peers), with TLS at the
# balancer. ../shared/peers/run.sh cannot be reused for this: it builds
# http:// URLs and starts its peers with their plain configs, so this
# script is the minimum of its harness again (start pinned under `timeout`,
# stop by PID, CPU from /proc, wait for a quiet machine).
#
# One certificate for all three: ECDSA P-256, self-signed for localhost and
# 127.0.0.1, made by openssl into OUT/cert.pem (certificate and key in one
# PEM, as HAProxy's `crt` and sluice's -tls-cert take it). The same TLS
# settings for all three (bench/conf/nginx-tls.conf, bench/conf/haproxy-tls.cfg
# say how): TLS 1.2 and 1.3, TLS 1.3 suites in Go's order (AES-128-GCM first),
# resumption by session tickets only, ALPN h2 and http/1.1. A check before
# each system's points records what a client gets (protocol, suite, ALPN,
# whether a second connection resumes) as the system's `check` row.
#
# Modes (MODES):
#   ka   keep-alive HTTP/1.1 over TLS: wrk https://, c$CONNS
#   hs   handshake-heavy: a new connection (TCP and TLS) per request, wrk
#        -H "Connection: close"; the server closes after each answer. wrk
#        offers the session of the connection before, so these handshakes
#        are TLS 1.3 resumptions (PSK with ECDHE, no certificate signature)
#        wherever the server hands out tickets (the check rows say it does;
#        an nginx access log of $ssl_session_reused showed all but each
#        wrk connection's first resumed). Full handshakes are not measured
#        here.
#   h2   HTTP/2 over TLS: h2load -t1 -c$H2_CONNS -m$H2_STREAMS, against the
#        systems in H2_SYSTEMS (nginx with `listen ... ssl http2`); h2load
#        gives no percentiles: its mean request time stands in p50's
#        column, and p99 is left out
#   http plain keep-alive HTTP/1.1 to every system (wrk http://, c$CONNS):
#        each one's plain listener beside its TLS one, the same balancing
#        (the peers' configs), interleaved as the other modes are: the
#        ratio to nginx of issue 25 without TLS
#   plain  sluice's own -http-listen (the same process), keep-alive wrk
#        http://, c$CONNS: the base of the CPU-per-request ratio TLS ÷ plain
#        (issue 19's target: at most 1.3)
# Each point is run ROUNDS times; the round with the median req/s is kept
# (its latency, errors and CPU with it) and every round's req/s and CPU per
# request are recorded. The systems run side by side for the whole
# measurement, each pinned to LB_CPUS in a capped group of its own, and
# the rounds interleave them: round r runs every system once (the order
# turned by one each round), and in ka sluice's plain round right after its
# TLS round, so the ratios compare like with like on a machine whose speed
# moves from one minute to the next. TLS ÷ plain is given as the median of
# the per-round ratios (results row ka.cN.tls_over_plain).
#
# sluice runs as `sluice run` with its defaults as in bench/http.sh, both
# listeners (-http-listen 127.0.0.1:$PORT -https-listen 127.0.0.1:$TLS_PORT),
# the per-source limits lifted as bench/http.sh does, and the handshake rate
# cap lifted (-tls-handshake-rate 0: nginx and HAProxy have none, and the
# default of 1000 handshakes/s would refuse hs's load) and the bound on
# handshakes in flight raised to 4096: wrk is one source address, and one
# source may hold an eighth of it (by default 32 of 256), so at c200 the
# default refused most of wrk's handshakes (measured: 28,575 socket errors
# in an hs c200 round, 1,069 in a ka c200 one).
#
# Knobs: DURATION=10 (s per round) ROUNDS=3 CONNS="50 200" MODES="ka hs h2"
#   H2_CONNS=50 H2_STREAMS=10 H2_SYSTEMS="nginx sluice" (add haproxy)
#   SYSTEMS="haproxy nginx sluice" GMP=1 (sluice's GOMAXPROCS)
#   PIN=1 LB_CPUS=0 GEN_CPUS=1 LB_QUOTA=50 (% of one core; empty: no cap)
#   QUIET_PCT=10 QUIET_MAX=120 (before each round: wait until other
#   processes use at most QUIET_PCT % of a core, at most QUIET_MAX s)
#   PORT=18095 (sluice HTTP) TLS_PORT=18543 (sluice HTTPS)
#   HAPROXY_PORT=18541 NGINX_PORT=18542 (TLS) HAPROXY_PLAIN_PORT=18551
#   NGINX_PLAIN_PORT=18552 (plain HTTP) SLUICE_FLAGS="" (extra flags)
#   SLUICE_BIN (a sluice binary to measure; default: this tree, built into OUT)
#   PEERS=$ROOT/../shared/peers OUT=$TMPDIR/sluice-bench/https-<timestamp>
# Output: OUT/results.tsv (system, MODE.cN.metric, value; systems named as
# run.sh names them: http-haproxy, http-nginx, http-target = sluice over TLS,
# http-target-plain = sluice over plain HTTP), OUT/MODE/results.tsv (the
# same rows without the MODE prefix, with an env.txt, so
# `go run ./bench/plot -in OUT/MODE` charts one mode), every raw wrk/h2load
# output and every server's log. Every process it starts runs under
# `timeout` and is stopped by its PID.
set -u
case ${SLUICE_BIN:-} in ""|/*) ;; *) SLUICE_BIN=$(pwd -P)/$SLUICE_BIN ;; esac   # relative to the caller
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-"50 200"}
MODES=${MODES:-"ka hs h2"}
H2_CONNS=${H2_CONNS:-50}
H2_STREAMS=${H2_STREAMS:-10}
H2_SYSTEMS=${H2_SYSTEMS-"nginx sluice"}
SYSTEMS=${SYSTEMS-"haproxy nginx sluice"}
GMP=${GMP:-1}
PIN=${PIN:-1}
LB_CPUS=${LB_CPUS:-0}
GEN_CPUS=${GEN_CPUS:-1}
LB_QUOTA=${LB_QUOTA-50}
QUIET_PCT=${QUIET_PCT:-10}
QUIET_MAX=${QUIET_MAX:-120}
PORT=${PORT:-18095}
TLS_PORT=${TLS_PORT:-18543}
HAPROXY_PORT=${HAPROXY_PORT:-18541}
NGINX_PORT=${NGINX_PORT:-18542}
HAPROXY_PLAIN_PORT=${HAPROXY_PLAIN_PORT:-18551}
NGINX_PLAIN_PORT=${NGINX_PLAIN_PORT:-18552}
SLUICE_FLAGS=${SLUICE_FLAGS:-}
PEERS=${PEERS:-$ROOT/../shared/peers}
SERVER_TTL=${SERVER_TTL:-3600}
OUT=${OUT:-${TMPDIR:-/tmp}/sluice-bench/https-$(date +%Y%m%d-%H%M%S)}
HZ=$(getconf CLK_TCK)

log() { echo "[$(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# isnum VALUE: VALUE is a non-negative integer.
isnum() { [[ $1 =~ ^[0-9]+$ ]]; }
for k in DURATION ROUNDS H2_CONNS H2_STREAMS GMP LB_CPUS GEN_CPUS QUIET_PCT QUIET_MAX PORT TLS_PORT HAPROXY_PORT NGINX_PORT HAPROXY_PLAIN_PORT NGINX_PLAIN_PORT; do
    isnum "${!k}" || die "$k=${!k}: want a non-negative integer"
done
[ "$ROUNDS" -ge 1 ] || die "ROUNDS=$ROUNDS: want at least 1"
[ "$DURATION" -ge 1 ] || die "DURATION=$DURATION: want at least 1 (seconds)"
[ -z "$LB_QUOTA" ] || { isnum "$LB_QUOTA" && [ "$LB_QUOTA" -ge 1 ] && [ "$LB_QUOTA" -le 100 ]; } ||
    die "LB_QUOTA=$LB_QUOTA: want a per cent of one core, 1 to 100, or empty for no cap"
for c in $CONNS $H2_CONNS; do isnum "$c" && [ "$c" -ge 1 ] || die "connection count $c (CONNS/H2_CONNS): want a positive integer"; done
for m in $MODES; do case $m in ka|hs|h2|http|plain) ;; *) die "MODES: unknown mode $m (want ka, hs, h2, http, plain)" ;; esac; done
for s in $SYSTEMS $H2_SYSTEMS; do case $s in haproxy|nginx|sluice) ;; *) die "SYSTEMS/H2_SYSTEMS: unknown system $s (want haproxy, nginx, sluice)" ;; esac; done
case " $SYSTEMS " in *" sluice "*) case " $MODES " in *" ka "*) MODES="$MODES plain" ;; esac ;; esac
MODES=$(echo "$MODES" | tr ' ' '\n' | awk 'NF && !seen[$0]++' | tr '\n' ' ')

[ -z "${SLUICE_BIN:-}" ] || { [ -f "$SLUICE_BIN" ] && [ -x "$SLUICE_BIN" ]; } ||
    die "SLUICE_BIN=$SLUICE_BIN: want an executable sluice binary"
[ -f "$PEERS/conf/nginx-backend.conf" ] || die "no $PEERS/conf/nginx-backend.conf (PEERS=$PEERS)"
for b in wrk h2load haproxy nginx openssl curl taskset timeout ss; do
    command -v "$b" >/dev/null || die "$b not installed (scripts/install-bench-deps.sh)"
done

mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd -P) || die "OUT=$OUT: cannot make the directory"
BIN=${SLUICE_BIN:-$OUT/sluice}
RES=$OUT/results.tsv

# ---------------------------------------------------------------- processes
STARTED=()   # PIDs of servers we started (each wrapped by `timeout`)
LASTPID=

# quota_group NAME: the procs file of a CPU cgroup of NAME's own, capped at
# LB_QUOTA % of one core over 10 ms periods (cgroup v2 cpu.max, else v1 cfs
# quota): with the systems interleaved, each balancer has a cap of its own.
quota_group() {
    local g
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        g=/sys/fs/cgroup/sluice-https-lb-$1
        mkdir -p "$g" && echo "$((LB_QUOTA * 100)) 10000" > "$g/cpu.max" || die "cannot set cpu.max in $g"
    else
        g=/sys/fs/cgroup/cpu/sluice-https-lb-$1
        mkdir -p "$g" && echo 10000 > "$g/cpu.cfs_period_us" && echo "$((LB_QUOTA * 100))" > "$g/cpu.cfs_quota_us" \
            || die "cannot set cpu.cfs_quota_us in $g"
    fi
    echo "$g/cgroup.procs"
}

# start NAME CPUS CMD...: CMD in the background (cwd OUT, log OUT/NAME.log),
# pinned to CPUS, in the quota group when on LB_CPUS, capped at SERVER_TTL
# seconds; sets LASTPID.
start() {
    local name=$1 cpus=$2 quota=""; shift 2
    local pin=()
    [ "$PIN" = 1 ] && pin=(taskset -c "$cpus")
    [ -n "$LB_QUOTA" ] && [ "$cpus" = "$LB_CPUS" ] && quota=$(quota_group "$name")
    ( [ -n "$quota" ] && echo "$BASHPID" > "$quota"
      cd "$OUT" && exec "${pin[@]}" timeout -k 5 "$SERVER_TTL" "$@" ) > "$OUT/$name.log" 2>&1 &
    LASTPID=$!
    STARTED+=("$LASTPID")
    log "started $name pid=$LASTPID${pin:+ (cpus $cpus)}"
}

# descendants PID: PID and all its descendants.
descendants() {
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v root="$1" '
        { p = index($0, ") "); split(substr($0, p + 2), a, " "); kids[a[2]] = kids[a[2]] " " $1 }
        END { q[1] = root; n = 1; for (i = 1; i <= n; i++) { print q[i]; m = split(kids[q[i]], k, " ");
              for (j = 1; j <= m; j++) q[++n] = k[j] } }'
}

# stop PID: TERM to a process we started, KILL to what is left of its tree
# after 5 s.
stop() {
    local pid=$1 d tree p keep=()
    tree=$(descendants "$pid")
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    for d in $tree; do kill -0 "$d" 2>/dev/null && kill -KILL "$d" 2>/dev/null; done
    wait "$pid" 2>/dev/null
    for p in "${STARTED[@]}"; do [ "$p" != "$pid" ] && keep+=("$p"); done
    STARTED=("${keep[@]}")
}
cleanup() {
    local i
    for ((i = ${#STARTED[@]} - 1; i >= 0; i--)); do stop "${STARTED[i]}"; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port_busy() { ss -Hltn "sport = :$1" | grep -q .; }
wait_port() {
    for _ in $(seq 150); do port_busy "$1" && return 0; sleep 0.1; done
    die "nothing listening on port $1 (see $OUT/*.log)"
}
need_free() { port_busy "$1" && die "port $1 already in use by another process"; return 0; }

# ------------------------------------------------------------- CPU accounting
# ticks ROOTPID...: utime+stime (clock ticks) of the given process trees.
ticks() {
    local r t=0
    for r in "$@"; do
        [ -n "$r" ] || continue
        t=$((t + $(for p in $(descendants "$r"); do cat "/proc/$p/stat" 2>/dev/null; done |
                   awk '{ p = index($0, ") "); split(substr($0, p + 2), a, " "); s += a[12] + a[13] } END { print s + 0 }')))
    done
    echo "$t"
}
alltick() { cat /proc/[0-9]*/stat 2>/dev/null | awk '{ p = index($0, ") "); split(substr($0, p + 2), a, " "); print $1, a[12] + a[13] }'; }
# others T0 EXTRA_PIDS: clock ticks used since the alltick snapshot T0 by
# processes outside this script's tree and EXTRA_PIDS' trees.
others() {
    local ours p
    ours=" $(descendants "$$" | tr '\n' ' ') $(for p in $2; do descendants "$p"; done | tr '\n' ' ') "
    awk -v ours="$ours" 'NR == FNR { t0[$1] = $2; next }
        index(ours, " " $1 " ") == 0 { s += $2 - t0[$1] } END { print s + 0 }' <(echo "$1") <(alltick)
}
pct() { awk -v t="$1" -v s="$2" -v hz="$HZ" 'BEGIN { printf "%.0f", (s > 0 ? 100 * t / hz / s : 0) }'; }
wait_quiet() {
    local t=0 a p
    while :; do
        a=$(alltick); sleep 1
        p=$(pct "$(others "$a" "${STARTED[*]}")" 1)
        [ "$p" -le "$QUIET_PCT" ] && return 0
        [ "$t" -ge "$QUIET_MAX" ] && { log "  other processes use ${p}% of a core; measuring anyway"; return 0; }
        [ $((t % 30)) = 0 ] && log "  waiting for a quiet machine: other processes use ${p}% of a core"
        sleep 1; t=$((t + 2))
    done
}

# ---------------------------------------------------------------- results
# res SYSTEM MODE METRIC VALUE: one row in OUT/results.tsv (MODE.METRIC) and
# in OUT/MODE/results.tsv (METRIC).
res() {
    printf '%s\t%s.%s\t%s\n' "$1" "$2" "$3" "$4" >> "$RES"
    printf '%s\t%s\t%s\n' "$1" "$3" "$4" >> "$OUT/$2/results.tsv"
    log "  $1 $2.$3 = $4"
}
to_ms() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n += 0; else if (v ~ /s$/) n *= 1000; printf "%.2f", n }'; }
sysname() { case $1 in sluice) echo http-target ;; *) echo "http-$1" ;; esac; }

# wrk_parse FILE: sets R_RPS R_P50 R_P99 R_ERR from wrk's output.
wrk_parse() {
    R_RPS=$(awk '/^Requests\/sec/ { print int($2) }' "$1")
    R_P50=$(to_ms "$(awk '$1 == "50%" { print $2 }' "$1")")
    R_P99=$(to_ms "$(awk '$1 == "99%" { print $2 }' "$1")")
    R_ERR="non2xx=$(awk '/Non-2xx/ { print $NF }' "$1" | grep . || echo 0) sock=$(awk '/Socket errors/ { gsub(",", ""); print $4 + $6 + $8 + $10 }' "$1" | grep . || echo 0)"
}
# h2load_parse FILE: the same from h2load's output (no percentiles: the mean
# request time goes to R_P50, R_P99 stays empty); an answer not over h2 is
# an error.
h2load_parse() {
    R_RPS=$(awk '/^finished in/ { print int($4) }' "$1")
    R_P50=$(to_ms "$(awk '/^time for request:/ { print $6 }' "$1")")
    R_P99=
    R_ERR="non2xx=$(awk '/^status codes:/ { print $5 + $7 + $9 }' "$1" | grep . || echo 0) failed=$(awk '/^requests:/ { print $10 + $12 + $14 }' "$1" | grep . || echo 0)"
    grep -q '^Application protocol: h2$' "$1" || R_ERR="$R_ERR not-h2"
}

# Rounds are kept per point (POINT = SYSTEM|MODE|CONNS): RND_ALL[POINT] the
# rounds as "req/s|p50|p99|errors|cpu|us per request" lines, one per round.
declare -A RND_ALL=()

# gen_cmd MODE CONNS URL: sets CMD, the load generator's command line.
gen_cmd() {
    case $1 in
        ka|http|plain) CMD=(wrk -t1 -c"$2" -d"${DURATION}s" --timeout 5s --latency "$3") ;;
        hs) CMD=(wrk -t1 -c"$2" -d"${DURATION}s" --timeout 5s --latency -H "Connection: close" "$3") ;;
        h2) CMD=(h2load -t1 -c"$2" -m"$H2_STREAMS" -D"$DURATION" --warm-up-time=1s "$3") ;;
    esac
}

# one_round SYSTEM MODE CONNS URL LBPID R: one round of the mode's load
# against the system, added to its point's rounds.
one_round() {
    local sys=$1 mode=$2 c=$3 url=$4 lbp=$5 r=$6 f gen el t0 lb0 a0 lbt ot us
    local pin=()
    [ "$PIN" = 1 ] && pin=(taskset -c "$GEN_CPUS")
    gen_cmd "$mode" "$c" "$url"
    f=$OUT/$mode/$sys-c$c-r$r.out
    wait_quiet
    log "$sys $mode r$r: ${CMD[*]}"
    a0=$(alltick); lb0=$(ticks "$lbp"); t0=$(date +%s.%N)
    gen=$( { TIMEFORMAT='%U %S'; time "${pin[@]}" timeout $((DURATION + 30)) "${CMD[@]}" > "$f" 2>&1; } 2>&1 | awk '{ print $1 + $2 }')
    el=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
    lbt=$(( $(ticks "$lbp") - lb0 )); ot=$(others "$a0" "$lbp $BE_PID")
    if [ "$mode" = h2 ]; then h2load_parse "$f"; else wrk_parse "$f"; fi
    [ "${R_RPS:-0}" -gt 0 ] 2>/dev/null || R_ERR="$R_ERR no-answer"
    # h2load measures after its warm-up: the balancer's CPU over the
    # whole run is then a little above the measured period's.
    R_CPU="lb=$(pct "$lbt" "$el")% gen=$(awk -v c="$gen" -v e="$el" 'BEGIN { printf "%.0f", 100 * c / e }')% other=$(pct "$ot" "$el")%"
    # CPU per request from the ticks themselves (not the rounded per cent)
    us=$(awk -v t="$lbt" -v hz="$HZ" -v e="$el" -v r="${R_RPS:-0}" 'BEGIN { if (r > 0) printf "%.1f", t / hz / e * 1e6 / r; else print "n/a" }')
    log "  -> ${R_RPS:-FAIL} req/s p50=$R_P50 p99=${R_P99:-n/a} $R_ERR | $R_CPU | ${us} us/req"
    RND_ALL["$sys|$mode|$c"]+="${R_RPS:-0}|$R_P50|$R_P99|$R_ERR|$R_CPU|$us"$'\n'
    sleep 1
}

# keep_point SYSTEM MODE CONNS: the point's rows in the results, from the
# round with the median req/s (the lower middle one of an even count); the
# CPU per request is that round's too, and every round's req/s and CPU per
# request are recorded beside it.
keep_point() {
    local sys=$1 mode=$2 c=$3 rounds med name all allus us
    rounds=${RND_ALL["$sys|$mode|$c"]:-}
    [ -n "$rounds" ] || return 0
    med=$(printf '%s' "$rounds" | sort -t'|' -k1,1n | awk -v n="$(printf '%s' "$rounds" | grep -c .)" 'NR == int((n + 1) / 2)')
    IFS='|' read -r R_RPS R_P50 R_P99 R_ERR R_CPU us <<< "$med"
    all=$(printf '%s' "$rounds" | awk -F'|' 'NF { printf "%s%s", (n++ ? "," : ""), ($1 > 0 ? $1 : "FAIL") }')
    allus=$(printf '%s' "$rounds" | awk -F'|' 'NF { printf "%s%s", (n++ ? "," : ""), $6 }')
    name=$(sysname "$sys"); [ "$mode" = plain ] && name=http-target-plain
    res "$name" "$mode" "c$c.req_per_s" "$R_RPS"
    res "$name" "$mode" "c$c.p50_ms" "$R_P50"
    [ -n "$R_P99" ] && res "$name" "$mode" "c$c.p99_ms" "$R_P99"
    res "$name" "$mode" "c$c.errors" "$R_ERR"
    res "$name" "$mode" "c$c.cpu" "$R_CPU"
    res "$name" "$mode" "c$c.cpu_us_per_req" "$us"
    res "$name" "$mode" "c$c.rounds_req_per_s" "$all"
    res "$name" "$mode" "c$c.rounds_cpu_us_per_req" "$allus"
}

# keep_tls_over_plain CONNS: sluice's CPU per request over TLS ÷ plain HTTP
# round by round (the ka and plain rounds of the same round number ran one
# after the other on the same process) and the median of those ratios.
keep_tls_over_plain() {
    local c=$1 ratios med
    ratios=$(paste -d'|' <(printf '%s' "${RND_ALL["sluice|ka|$c"]:-}" | cut -d'|' -f6) \
                         <(printf '%s' "${RND_ALL["sluice|plain|$c"]:-}" | cut -d'|' -f6) |
        awk -F'|' '$1 + 0 > 0 && $2 + 0 > 0 { printf "%s%.3f", (n++ ? "," : ""), $1 / $2 }')
    [ -n "$ratios" ] || return 0
    med=$(echo "$ratios" | tr ',' '\n' | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }')
    res http-target ka "c$c.tls_over_plain_rounds" "$ratios"
    res http-target ka "c$c.tls_over_plain" "$med"
}

# tls_check SYSTEM ADDR: what a client gets from the system, as its check
# row: the answer of GET / over HTTPS, the protocol and suite, ALPN when h2
# is asked for, and whether a second connection resumes with the ticket of
# the first.
tls_check() {
    local sys=$1 addr=$2 body s1 s2 alpn proto suite reused
    body=$(curl -sk --max-time 5 "https://$addr/" "https://$addr/" | tr -d '\n')
    s1=$(timeout 10 openssl s_client -connect "$addr" -servername localhost -sess_out "$OUT/$sys.sess" \
        -alpn h2,http/1.1 -ign_eof < <(printf 'GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n') 2>&1 | tr -d '\000')
    s2=$(timeout 10 openssl s_client -connect "$addr" -servername localhost -sess_in "$OUT/$sys.sess" \
        -ign_eof < <(printf 'GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n') 2>&1 | tr -d '\000')
    proto=$(echo "$s1" | awk '/^New, / { print $2 }' | tr -d ',' | head -1)
    suite=$(echo "$s1" | awk '/^New, / { print $NF }' | head -1)
    alpn=$(echo "$s1" | awk -F': ' '/^ALPN protocol:/ { print $2 }' | head -1)
    if echo "$s2" | grep -q '^Reused, '; then reused=yes; else reused=no; fi
    res "$(sysname "$sys")" tls check "answers=${body:-none} proto=${proto:-?} suite=${suite:-?} alpn=${alpn:-none} resumed=$reused"
}

# start_system SYSTEM: start it, wait for its ports and check it; sets
# PID_OF[SYSTEM] and ADDR_OF[SYSTEM].
declare -A PID_OF=() ADDR_OF=() PLAIN_OF=()
start_system() {
    local sys=$1 addr
    case $sys in
        haproxy)
            addr=127.0.0.1:$HAPROXY_PORT; need_free "$HAPROXY_PORT"; need_free "$HAPROXY_PLAIN_PORT"
            PLAIN_OF[$sys]=127.0.0.1:$HAPROXY_PLAIN_PORT
            sed -e "s|@LISTEN@|$addr|" -e "s|@PLAIN@|${PLAIN_OF[$sys]}|" -e "s|@CERT@|$CERT|" "$ROOT/bench/conf/haproxy-tls.cfg" > "$OUT/haproxy-tls.cfg"
            start haproxy "$LB_CPUS" haproxy -db -f "$OUT/haproxy-tls.cfg" ;;
        nginx)
            addr=127.0.0.1:$NGINX_PORT; need_free "$NGINX_PORT"; need_free "$NGINX_PLAIN_PORT"
            PLAIN_OF[$sys]=127.0.0.1:$NGINX_PLAIN_PORT
            mkdir -p "$OUT/nginx-tls/logs" "$OUT/nginx-tls/tmp"
            sed -e "s|@LISTEN@|$addr|" -e "s|@PLAIN@|${PLAIN_OF[$sys]}|" -e "s|@CERT@|$CERT|" "$ROOT/bench/conf/nginx-tls.conf" > "$OUT/nginx-tls/nginx-tls.conf"
            start nginx-tls "$LB_CPUS" nginx -p "$OUT/nginx-tls" -c "$OUT/nginx-tls/nginx-tls.conf" \
                -e "$OUT/nginx-tls/logs/error.log" -g 'daemon off; master_process on;' ;;
        sluice)
            addr=127.0.0.1:$TLS_PORT; need_free "$TLS_PORT"; need_free "$PORT"
            PLAIN_OF[$sys]=127.0.0.1:$PORT
            # shellcheck disable=SC2086
            start sluice "$LB_CPUS" env GOMAXPROCS="$GMP" "$BIN" run -http-listen "127.0.0.1:$PORT" \
                -https-listen "$addr" -tls-cert "$CERT" -tls-handshake-rate 0 -tls-handshakes-max 4096 \
                -http-backend 127.0.0.1:18081 -http-backend 127.0.0.1:18082 -admin-listen '' \
                -data-dir "$OUT/data" -log-level warn -drain-timeout 3s \
                -http-backend-max-conns 65536 -http-max-conns-per-source 20000 $SLUICE_FLAGS ;;
    esac
    PID_OF[$sys]=$LASTPID ADDR_OF[$sys]=$addr
    wait_port "${addr##*:}"
    wait_port "${PLAIN_OF[$sys]##*:}"
    tls_check "$sys" "$addr"
}

# entries MODE: the systems a mode measures, "SYSTEM URL" a line (plain:
# sluice's own -http-listen).
entries() {
    local mode=$1 s
    for s in $SYSTEMS; do
        case $mode in
            h2) case " $H2_SYSTEMS " in *" $s "*) echo "$s https://${ADDR_OF[$s]}/" ;; esac ;;
            plain) [ "$s" = sluice ] && echo "sluice http://127.0.0.1:$PORT/" ;;
            http) echo "$s http://${PLAIN_OF[$s]}/" ;;
            *) echo "$s https://${ADDR_OF[$s]}/" ;;
        esac
    done
}

# run_mode MODE: every point of the mode, round by round: in each round
# every system once, the order turned by one each round, so that no
# system always runs first after a pause or right after the same other.
# In ka, when plain is asked for too, sluice's plain round runs right
# after its TLS round, on the same process (the TLS ÷ plain pairs).
run_mode() {
    local mode=$1 c r i n sys url list=() pairs=0
    mapfile -t list < <(entries "$mode")
    n=${#list[@]}; [ "$n" -gt 0 ] || return 0
    [ "$mode" = ka ] && case " $MODES " in *" plain "*) pairs=1 ;; esac
    for c in $( [ "$mode" = h2 ] && echo "$H2_CONNS" || echo "$CONNS"); do
        for r in $(seq "$ROUNDS"); do
            for ((i = 0; i < n; i++)); do
                read -r sys url <<< "${list[$(( (i + r - 1) % n ))]}"
                one_round "$sys" "$mode" "$c" "$url" "${PID_OF[$sys]}" "$r"
                if [ "$pairs" = 1 ] && [ "$sys" = sluice ]; then
                    one_round sluice plain "$c" "http://127.0.0.1:$PORT/" "${PID_OF[sluice]}" "$r"
                fi
            done
        done
        for sys in $SYSTEMS; do [ "$mode" = plain ] || keep_point "$sys" "$mode" "$c"; done
        case $mode in
            ka) [ "$pairs" = 1 ] && { keep_point sluice plain "$c"; keep_tls_over_plain "$c"; } ;;
            plain) keep_point sluice plain "$c" ;;
        esac
    done
}

# ---------------------------------------------------------------- main
# c200 holds about 400 descriptors in a balancer; raise the soft limit as
# far as the hard one allows, up to 65536 (the servers' own settings).
h=$(ulimit -Hn); [ "$h" = unlimited ] && h=65536; [ "$h" -gt 65536 ] && h=65536
ulimit -n "$h" 2>/dev/null || log "WARNING: cannot raise the descriptor limit (ulimit -n $(ulimit -n))"
: > "$RES"
for m in $MODES tls; do mkdir -p "$OUT/$m" && : > "$OUT/$m/results.tsv"; done
{
    echo "date: $(date -Is)"; echo "host: $(nproc) cpus, $(uname -r)"
    echo "pin=$PIN lb_cpus=$LB_CPUS gen_cpus=$GEN_CPUS lb_quota=${LB_QUOTA:-none} duration=$DURATION conns=$CONNS rounds=$ROUNDS h2_conns=$H2_CONNS h2_streams=$H2_STREAMS gomaxprocs=$GMP"
    haproxy -v | head -1; nginx -v 2>&1; wrk -v 2>&1 | head -1; h2load --version; openssl version; go version
    echo "loadavg before: $(cat /proc/loadavg)"
} > "$OUT/env.txt"
for m in $MODES; do
    case $m in
        ka) l="keep-alive HTTPS" ;; hs) l="HTTPS, a new connection per request" ;;
        h2) l="HTTP/2 over TLS (h2load -c$H2_CONNS -m$H2_STREAMS)" ;; plain) l="plain HTTP, sluice alone" ;;
        http) l="keep-alive plain HTTP" ;;
    esac
    { echo "load: $l"; cat "$OUT/env.txt"; } > "$OUT/$m/env.txt"
done
log "out: $OUT  modes: $MODES systems: $SYSTEMS pin=$PIN lb_cpus=$LB_CPUS gen_cpus=$GEN_CPUS lb_quota=${LB_QUOTA:-none}"

case " $SYSTEMS " in *" sluice "*)
    if [ -n "${SLUICE_BIN:-}" ]; then
        log "sluice: $BIN"
    else
        log "building sluice into $BIN"
        go build -o "$BIN" ./cmd/sluice || die "build failed"
    fi ;;
esac

# The certificate: ECDSA P-256, self-signed, for localhost and 127.0.0.1.
CERT=$OUT/cert.pem
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=localhost \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -keyout "$OUT/key.pem" -out "$OUT/crt.pem" 2> "$OUT/openssl.log" ||
    die "openssl could not make the certificate (see $OUT/openssl.log)"
cat "$OUT/crt.pem" "$OUT/key.pem" > "$CERT"
log "certificate: $(openssl x509 -in "$CERT" -noout -subject -ext subjectAltName 2>/dev/null | tr '\n' ' ')"

# The backends: the peers' nginx on :18081 and :18082, on GEN_CPUS.
need_free 18081; need_free 18082
mkdir -p "$OUT/nginx-backend/logs" "$OUT/nginx-backend/tmp"
start nginx-backend "$GEN_CPUS" nginx -p "$OUT/nginx-backend" -c "$PEERS/conf/nginx-backend.conf" \
    -e "$OUT/nginx-backend/logs/error.log" -g 'daemon off; master_process on;'
BE_PID=$LASTPID
wait_port 18081; wait_port 18082

# Every system runs for the whole measurement, each in its own capped
# group, and the rounds interleave them (run_mode): a system measured an
# hour after another on this machine meets another machine (HAProxy's own
# figure moved by 40 % between two runs of one system after the other).
for s in $SYSTEMS; do start_system "$s"; done
for mode in $MODES; do
    # plain is measured inside ka's rounds when both are asked for
    [ "$mode" = plain ] && case " $MODES " in *" ka "*) continue ;; esac
    run_mode "$mode"
done
cleanup; STARTED=()

# ---------------------------------------------------------------- summary
echo
echo "== HTTPS: sluice vs peers (TLS at the balancer; balancers pinned alone on CPU$LB_CPUS${LB_QUOTA:+, capped at $LB_QUOTA %}, load and backends on CPU$GEN_CPUS; median of $ROUNDS; $RES)"
awk -F'\t' '$2 == "tls.check" { n = $1; sub(/^http-/, "", n); if (n == "target") n = "sluice"; printf "%-8s %s\n", n, $3 }' "$RES"
echo
awk -F'\t' -v modes="$MODES" -v conns="$CONNS" -v h2conns="$H2_CONNS" '
    function name(s) { return s == "http-target" ? "sluice" : s == "http-target-plain" ? "sluice (plain)" : substr(s, 6) }
    { v[$1, $2] = $3 }
    END {
        ns = split("http-target http-haproxy http-nginx http-target-plain", sys, " ")
        nm = split(modes, mode, " ")
        printf "%-5s %-18s %6s %10s %8s %8s %7s %8s  %s\n", "mode", "system", "conns", "req/s", "p50 ms", "p99 ms", "lb cpu", "us/req", "errors"
        print "(h2: the mean request time in the p50 column; lb cpu: the balancer process, % of one core)"
        for (m = 1; m <= nm; m++) {
            nc = split(mode[m] == "h2" ? h2conns : conns, cs, " ")
            for (i = 1; i <= ns; i++) for (j = 1; j <= nc; j++) {
                k = mode[m] "." "c" cs[j]; s = sys[i]
                if (!((s, k ".req_per_s") in v)) continue
                cpu = v[s, k ".cpu"]; sub(/ .*/, "", cpu); sub(/^lb=/, "", cpu)
                printf "%-5s %-18s %6s %10s %8s %8s %7s %8s  %s\n", mode[m], name(s),
                    cs[j], v[s, k ".req_per_s"], v[s, k ".p50_ms"], ((s, k ".p99_ms") in v ? v[s, k ".p99_ms"] : "-"), cpu, v[s, k ".cpu_us_per_req"], v[s, k ".errors"]
            }
        }
        print ""
        for (m = 1; m <= nm; m++) {
            if (mode[m] == "plain") continue
            nc = split(mode[m] == "h2" ? h2conns : conns, cs, " ")
            for (j = 1; j <= nc; j++) {
                k = mode[m] ".c" cs[j]; t = v["http-target", k ".req_per_s"]
                if (t == "") continue
                line = ""
                for (i = 2; i <= 3; i++) {
                    s = sys[i]; if (!((s, k ".req_per_s") in v) || v[s, k ".req_per_s"] + 0 == 0) continue
                    line = line sprintf("  %.2fx %s", t / v[s, k ".req_per_s"], name(s))
                }
                if (line != "") printf "%-3s c%-4s sluice req/s%s\n", mode[m], cs[j], line
            }
        }
        split(conns, cs, " ")
        for (j = 1; j in cs; j++) {
            a = v["http-target", "ka.c" cs[j] ".cpu_us_per_req"]; b = v["http-target-plain", "plain.c" cs[j] ".cpu_us_per_req"]
            if (a + 0 > 0 && b + 0 > 0)
                printf "c%-4s sluice CPU per request over TLS / plain HTTP: %.1f / %.1f us = %.2fx (the median rounds)\n", cs[j], a, b, a / b
            r = v["http-target", "ka.c" cs[j] ".tls_over_plain"]
            if (r != "")
                printf "c%-4s sluice CPU per request over TLS / plain HTTP, round by round: %s, median %.2fx (target: at most 1.30x)\n", cs[j], v["http-target", "ka.c" cs[j] ".tls_over_plain_rounds"], r
        }
        for (k in v) {
            split(k, kk, SUBSEP)
            if (kk[2] !~ /\.cpu$/ || !match(v[k], /other=[0-9]+%/)) continue
            o = substr(v[k], RSTART + 6, RLENGTH - 7) + 0
            if (o > maxo) maxo = o
        }
        if (maxo > 25)
            printf "\nWARNING: other processes used up to %d%% of a core during the points kept: the figures are disturbed\n", maxo
    }' "$RES"
echo
log "charts of one mode: go run ./bench/plot -in $OUT/ka (or hs, h2)"
