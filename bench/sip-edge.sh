#!/usr/bin/env bash
# SIP edge benchmark: sluice next to Kamailio as a TLS and WebSocket edge
# in front of the same plain UDP backends, on loopback only.
#
# usage: bench/sip-edge.sh [MODES...]        (default: tls ws mem)
#   tls  clean calls/s over SIP over TLS: SIPp's record-route aware UAC
#        (uac_rr.xml, TCP, one connection: -t t1) -> stunnel (client mode;
#        Debian's SIPp has no TLS) -> {sluice :5081 | Kamailio :5091} over
#        TLS -> the SIPp answerers (uas_rr.xml) on UDP :5071/:5072
#   ws   clean calls/s over SIP over WebSocket: bench/wsload (WS_CONNS
#        connections, INVITE / 200 / ACK / BYE along the route set)
#        -> {sluice :8081 | Kamailio :8091} (WS; WS_SCHEME=wss: :4481 | :4491)
#        -> the same answerers
#   mem  memory per idle WSS connection (IDLE_SCHEME=ws: WS): IDLE_CONNS
#        connections opened by bench/wsload -mode idle (each carries one OPTIONS with
#        Max-Forwards 0, which the edge answers itself, as a browser's
#        first REGISTER would pass the edge's wait for a first message)
#        and then held silent; (the balancer's memory
#        with them - before them) / IDLE_CONNS. Memory is the PSS summed
#        over the balancer's processes (Kamailio's are many and share its
#        shm; for the one sluice process PSS is its RSS), read from
#        /proc/PID/smaps_rollup after SETTLE s; RSS is recorded too.
# A rate is clean when every call succeeds (no failed call, none missing)
# and the answerers retransmitted nothing (their 200 is retransmitted
# when the ACK is late). The ladder EDGE_RATES is walked up to the first
# unclean rate; the highest clean one is the system's figure.
#
# Every balancer runs alone on CPU LB_CPUS (LB_QUOTA % of it, a CPU
# cgroup, as ../shared/peers/run.sh does), everything else on GEN_CPUS.
# sluice: `sluice sip` with its defaults but for the limits one load
# generator on one address needs lifted (-sip-tcp-max-conns and
# -sip-tcp-max-conns-per-source, -tls-handshake-rate 0,
# -tls-handshakes-max 4096; see bench/https.sh) and no OPTIONS pings
# (SIPp answerers take them for calls). Kamailio: bench/conf/kamailio-edge.cfg
# (tm, double Record-Route, one worker of each kind) with -m KAM_SHM_MB.
# One self-signed ECDSA P-256 certificate for both, made by openssl.
#
# Knobs: SYSTEMS="sluice kamailio" EDGE_RATES="250 500 1000 1500 2000 3000 4000"
#   EDGE_SECS=10 (per rate) WS_CONNS=20 WS_SCHEME=ws IDLE_CONNS=10000
#   IDLE_SCHEME=wss (ws or wss: the idle connections of mem)
#   OPEN_RATE=1000 (idle connections opened per second) SETTLE=5
#   PIN=1 LB_CPUS=0 GEN_CPUS=1 LB_QUOTA=50 (empty: no cap) KAM_SHM_MB=2048
#   SLUICE_BIN (default: this tree, built into OUT) SLUICE_FLAGS (extra)
#   OUT=$TMPDIR/sluice-bench/sip-edge-<timestamp>
# Output: OUT/results.tsv (system, metric, value), a table on stdout ready
# for bench/RESULTS.md, every log. Every process it starts runs under
# `timeout` and is stopped by its PID.
set -u
usage() { sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; }
case ${1:-} in -h|--help|help) usage; exit 0 ;; esac
case ${SLUICE_BIN:-} in ""|/*) ;; *) SLUICE_BIN=$(pwd -P)/$SLUICE_BIN ;; esac
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
MODES=${*:-tls ws mem}
SYSTEMS=${SYSTEMS-"sluice kamailio"}
EDGE_RATES=${EDGE_RATES:-"250 500 1000 1500 2000 3000 4000"}
EDGE_SECS=${EDGE_SECS:-10}
WS_CONNS=${WS_CONNS:-20}
WS_SCHEME=${WS_SCHEME:-ws}
IDLE_CONNS=${IDLE_CONNS:-10000}
IDLE_SCHEME=${IDLE_SCHEME:-wss}
OPEN_RATE=${OPEN_RATE:-1000}
SETTLE=${SETTLE:-5}
PIN=${PIN:-1}
LB_CPUS=${LB_CPUS:-0}
GEN_CPUS=${GEN_CPUS:-1}
LB_QUOTA=${LB_QUOTA-50}
KAM_SHM_MB=${KAM_SHM_MB:-2048}
SLUICE_FLAGS=${SLUICE_FLAGS:-}
SERVER_TTL=${SERVER_TTL:-3600}
OUT=${OUT:-${TMPDIR:-/tmp}/sluice-bench/sip-edge-$(date +%Y%m%d-%H%M%S)}
HZ=$(getconf CLK_TCK)
SCEN=$ROOT/sip/testdata/sipp
# fixed loopback ports (UDP: sluice 5080, Kamailio 5090, answerers 5071/5072)
SL_UDP=5080 SL_TLS=5081 SL_WS=8081 SL_WSS=4481
KAM_TLS=5091 KAM_WS=8091 KAM_WSS=4491
TUNNEL=5099 UAS1=5071 UAS2=5072 SL_ADMIN=18097

log() { echo "[$(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
isnum() { [[ $1 =~ ^[0-9]+$ ]]; }
for k in EDGE_SECS WS_CONNS IDLE_CONNS OPEN_RATE SETTLE KAM_SHM_MB; do
    isnum "${!k}" && [ "${!k}" -ge 1 ] || die "$k=${!k}: want a positive integer"
done
for k in LB_CPUS GEN_CPUS; do isnum "${!k}" || die "$k=${!k}: want a CPU number"; done
for r in $EDGE_RATES; do isnum "$r" && [ "$r" -ge 1 ] || die "EDGE_RATES: $r is not a positive integer (calls/s)"; done
[ -z "$LB_QUOTA" ] || { isnum "$LB_QUOTA" && [ "$LB_QUOTA" -ge 1 ] && [ "$LB_QUOTA" -le 100 ]; } ||
    die "LB_QUOTA=$LB_QUOTA: want a per cent of one core, 1 to 100, or empty for no cap"
case $WS_SCHEME in ws|wss) ;; *) die "WS_SCHEME=$WS_SCHEME: want ws or wss" ;; esac
case $IDLE_SCHEME in ws|wss) ;; *) die "IDLE_SCHEME=$IDLE_SCHEME: want ws or wss" ;; esac
for m in $MODES; do case $m in tls|ws|mem) ;; *) die "unknown mode $m (want tls, ws, mem; usage: bench/sip-edge.sh -h)" ;; esac; done
for s in $SYSTEMS; do case $s in sluice|kamailio) ;; *) die "SYSTEMS: unknown system $s (want sluice, kamailio)" ;; esac; done
need="sipp stunnel4 openssl curl taskset timeout ss go"
case " $SYSTEMS " in *" kamailio "*) need="$need kamailio" ;; esac
for b in $need; do
    command -v "$b" >/dev/null || die "$b not installed (scripts/install-test-deps.sh: sip-tester stunnel4 kamailio kamailio-tls-modules kamailio-websocket-modules)"
done
case " $SYSTEMS " in *" kamailio "*) kam_mods="tls websocket xhttp" ;; *) kam_mods="" ;; esac
for m in $kam_mods; do
    [ -f "/usr/lib/x86_64-linux-gnu/kamailio/modules/$m.so" ] || [ -n "$(find /usr/lib*/ -path '*kamailio/modules/'"$m.so" 2>/dev/null | head -1)" ] ||
        die "Kamailio module $m.so missing (kamailio-tls-modules, kamailio-websocket-modules)"
done
# 10,000 connections at each end, each a descriptor.
want_fds=$((IDLE_CONNS + 2000))
ulimit -n "$(ulimit -Hn)" 2>/dev/null
[ "$(ulimit -n)" = unlimited ] || [ "$(ulimit -n)" -ge "$want_fds" ] ||
    die "open files limit $(ulimit -n) (hard $(ulimit -Hn)): IDLE_CONNS=$IDLE_CONNS needs $want_fds; raise the hard limit or lower IDLE_CONNS"

mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd -P) || die "OUT=$OUT: cannot make the directory"
RES=$OUT/results.tsv
: > "$RES"
res() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$RES"; log "  $1 $2 = $3"; }

# ---------------------------------------------------------------- processes
STARTED=()
LASTPID=
quota_group() {
    local g
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        g=/sys/fs/cgroup/sluice-edge-lb
        mkdir -p "$g" && echo "$((LB_QUOTA * 100)) 10000" > "$g/cpu.max" || die "cannot set cpu.max in $g"
    else
        g=/sys/fs/cgroup/cpu/sluice-edge-lb
        mkdir -p "$g" && echo 10000 > "$g/cpu.cfs_period_us" && echo "$((LB_QUOTA * 100))" > "$g/cpu.cfs_quota_us" \
            || die "cannot set cpu.cfs_quota_us in $g"
    fi
    echo "$g/cgroup.procs"
}
# start NAME CPUS CMD...: in the background (log OUT/NAME.log), pinned, in
# the quota group when on LB_CPUS, under `timeout`; sets LASTPID.
start() {
    local name=$1 cpus=$2 quota=""; shift 2
    local pin=()
    [ "$PIN" = 1 ] && pin=(taskset -c "$cpus")
    [ -n "$LB_QUOTA" ] && [ "$cpus" = "$LB_CPUS" ] && quota=$(quota_group)
    ( [ -n "$quota" ] && echo "$BASHPID" > "$quota"
      cd "$OUT" && exec "${pin[@]}" timeout -k 5 "$SERVER_TTL" "$@" ) > "$OUT/$name.log" 2>&1 &
    LASTPID=$!
    STARTED+=("$LASTPID")
    log "started $name pid=$LASTPID${pin:+ (cpus $cpus)}"
}
descendants() {
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v root="$1" '
        { p = index($0, ") "); split(substr($0, p + 2), a, " "); kids[a[2]] = kids[a[2]] " " $1 }
        END { q[1] = root; n = 1; for (i = 1; i <= n; i++) { print q[i]; m = split(kids[q[i]], k, " ");
              for (j = 1; j <= m; j++) q[++n] = k[j] } }'
}
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

busy_tcp() { ss -Hltn "sport = :$1" | grep -q .; }
busy_udp() { ss -Hlun "sport = :$1" | grep -q .; }
wait_tcp() { for _ in $(seq 150); do busy_tcp "$1" && return 0; sleep 0.1; done; die "nothing listening on tcp $1 (see $OUT/*.log)"; }
wait_udp() { for _ in $(seq 150); do busy_udp "$1" && return 0; sleep 0.1; done; die "nothing on udp $1 (see $OUT/*.log)"; }
for p in $SL_TLS $SL_WS $SL_WSS $SL_ADMIN $KAM_TLS $KAM_WS $KAM_WSS $TUNNEL; do busy_tcp "$p" && die "tcp port $p already in use"; done
for p in $SL_UDP 5090 $UAS1 $UAS2; do busy_udp "$p" && die "udp port $p already in use"; done

# ticks PID...: utime+stime (clock ticks) of the process trees.
ticks() {
    local r t=0
    for r in "$@"; do
        t=$((t + $(for p in $(descendants "$r"); do cat "/proc/$p/stat" 2>/dev/null; done |
                   awk '{ p = index($0, ") "); split(substr($0, p + 2), a, " "); s += a[12] + a[13] } END { print s + 0 }')))
    done
    echo "$t"
}
# mem PID: "PSS_KB RSS_KB" summed over the process tree of PID, without
# the `timeout` wrapper (its own few hundred kB are not the balancer's).
mem() {
    local p
    for p in $(descendants "$1"); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = timeout ] && continue
        cat "/proc/$p/smaps_rollup" 2>/dev/null
    done | awk '$1 == "Pss:" { p += $2 } $1 == "Rss:" { r += $2 } END { printf "%d %d\n", p, r }'
}
csvcol() { awk -F';' -v c="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == c) k = i } END { print (k ? $k : "") }' "$1"; }

# ---------------------------------------------------------------- set up
BIN=${SLUICE_BIN:-$OUT/sluice}
if [ -z "${SLUICE_BIN:-}" ]; then
    log "building sluice into $BIN"
    go build -o "$BIN" ./cmd/sluice || die "build failed"
fi
go build -o "$OUT/wsload" ./bench/wsload || die "wsload build failed"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 -subj /CN=localhost \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -keyout "$OUT/key.pem" -out "$OUT/cert.pem" 2>"$OUT/openssl.log" ||
    die "openssl could not make a certificate (see $OUT/openssl.log)"
printf '[server:default]\nmethod = TLSv1.2+\nverify_certificate = no\nrequire_certificate = no\nprivate_key = %s\ncertificate = %s\n\n[client:default]\nverify_certificate = no\nrequire_certificate = no\n' \
    "$OUT/key.pem" "$OUT/cert.pem" > "$OUT/kamailio-tls.cfg"
printf '1 sip:127.0.0.1:%s\n1 sip:127.0.0.1:%s\n' "$UAS1" "$UAS2" > "$OUT/dispatcher.list"

for p in $UAS1 $UAS2; do
    start "uas$p" "$GEN_CPUS" sipp -sf "$SCEN/uas_rr.xml" -i 127.0.0.1 -p "$p" -nostdin -buff_size 1048576 \
        -trace_stat -stf "$OUT/uas$p.csv" -fd 1
done
wait_udp "$UAS1"; wait_udp "$UAS2"
uas_retrans() {   # retransmissions of both answerers so far
    local p t=0 v
    for p in $UAS1 $UAS2; do v=$(csvcol "$OUT/uas$p.csv" 'Retransmissions(C)' | tail -1); t=$((t + ${v:-0})); done
    echo "$t"
}

# start_system SYSTEM: sets SYS_PID, SYS_TLS, SYS_WS, SYS_WSS.
start_system() {
    case $1 in
    sluice)
        mkdir -p "$OUT/sluice-data"
        start sluice "$LB_CPUS" "$BIN" sip -sip-listen "127.0.0.1:$SL_UDP" -sip-tls-listen "127.0.0.1:$SL_TLS" \
            -sip-ws-listen "127.0.0.1:$SL_WS" -sip-wss-listen "127.0.0.1:$SL_WSS" -tls-cert "$OUT/cert.pem,key=$OUT/key.pem" \
            -sip-backend "127.0.0.1:$UAS1" -sip-backend "127.0.0.1:$UAS2" -sip-health-interval 0 \
            -sip-tcp-max-conns $((IDLE_CONNS + 1000)) -sip-tcp-max-conns-per-source $((IDLE_CONNS + 1000)) \
            -tls-handshake-rate 0 -tls-handshakes-max 4096 \
            -admin-listen "127.0.0.1:$SL_ADMIN" \
            -affinity-key-file "$OUT/affinity.key" -data-dir "$OUT/sluice-data" -log-level warn $SLUICE_FLAGS
        SYS_PID=$LASTPID SYS_TLS=$SL_TLS SYS_WS=$SL_WS SYS_WSS=$SL_WSS ;;
    kamailio)
        mkdir -p "$OUT/kamailio-run"
        start kamailio "$LB_CPUS" kamailio -f "$ROOT/bench/conf/kamailio-edge.cfg" -DD -E -m "$KAM_SHM_MB" -M 16 \
            -Y "$OUT/kamailio-run" -A "DSLIST=\"$OUT/dispatcher.list\"" -A "TLSCFG=\"$OUT/kamailio-tls.cfg\""
        SYS_PID=$LASTPID SYS_TLS=$KAM_TLS SYS_WS=$KAM_WS SYS_WSS=$KAM_WSS ;;
    esac
    wait_tcp "$SYS_TLS"; wait_tcp "$SYS_WS"; wait_tcp "$SYS_WSS"
    sleep 1
}

# ---------------------------------------------------------------- legs
# step SYSTEM LEG RATE: one bounded run of EDGE_SECS at RATE; returns 0 when
# clean; sets S_LINE.
step() {
    local sys=$1 leg=$2 r=$3 n=$(( $3 * EDGE_SECS )) dir=$OUT/$1-$2-$3 ok fail rt0 rt t0 lb0 el lbt
    mkdir -p "$dir"
    rt0=$(uas_retrans); lb0=$(ticks "$SYS_PID"); t0=$(date +%s.%N)
    if [ "$leg" = tls ]; then
        (cd "$dir" && taskset -c "$GEN_CPUS" timeout $((EDGE_SECS + 60)) sipp "127.0.0.1:$TUNNEL" -sf "$SCEN/uac_rr.xml" -t t1 \
            -i 127.0.0.1 -p 5098 -r "$r" -m "$n" -nostdin -timeout $((EDGE_SECS + 40))s -recv_timeout 8000 \
            -trace_stat -stf stat.csv -fd 1 -trace_err -max_log_size 2000000 > uac.out 2>&1)
        ok=$(csvcol "$dir/stat.csv" 'SuccessfulCall(C)' | tail -1); fail=$(csvcol "$dir/stat.csv" 'FailedCall(C)' | tail -1)
    else
        local port=$SYS_WS; [ "$WS_SCHEME" = wss ] && port=$SYS_WSS
        taskset -c "$GEN_CPUS" timeout $((EDGE_SECS + 60)) "$OUT/wsload" -mode calls -url "$WS_SCHEME://127.0.0.1:$port/" \
            -conns "$WS_CONNS" -rate "$r" -calls "$n" > "$dir/wsload.out" 2>&1
        ok=$(sed -n 's/.* ok=\([0-9]*\) .*/\1/p' "$dir/wsload.out"); fail=$(sed -n 's/.* failed=\([0-9]*\) .*/\1/p' "$dir/wsload.out")
    fi
    sleep 2   # the last BYEs' answers, and the answerers' statistics (written every second)
    el=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
    lbt=$(( $(ticks "$SYS_PID") - lb0 )); rt=$(( $(uas_retrans) - rt0 ))
    S_CPU=$(awk -v t="$lbt" -v s="$el" -v hz="$HZ" 'BEGIN { printf "%.0f", 100 * t / hz / s }')
    S_LINE="rate=$r ok=${ok:-0}/$n failed=${fail:-?} uas_retrans=$rt lb_cpu=${S_CPU}%"
    log "  $sys $leg: $S_LINE"
    [ "${ok:-0}" = "$n" ] && [ "${fail:-1}" = 0 ] && [ "$rt" = 0 ]
}

ladder() {   # ladder SYSTEM LEG: the highest clean rate of EDGE_RATES
    local sys=$1 leg=$2 r best=0 best_cpu="" all=""
    for r in $EDGE_RATES; do
        if step "$sys" "$leg" "$r"; then best=$r best_cpu=$S_CPU; all="$all $r:clean"
        else all="$all $r:unclean"; break; fi
    done
    res "$sys" "$leg.max_clean_cps" "$best"
    res "$sys" "$leg.lb_cpu_pct_at_max" "${best_cpu:-n/a}"
    res "$sys" "$leg.ladder" "${all# }"
}

leg_tls() {
    start stunnel "$GEN_CPUS" stunnel4 "$OUT/stunnel-$1.conf"
    local st=$LASTPID
    wait_tcp "$TUNNEL"
    ladder "$1" tls
    stop "$st"
}

# gostats: "HEAP_INUSE_BYTES GOROUTINES" of sluice, from its /metrics.
gostats() {
    curl -s --max-time 5 "http://127.0.0.1:$SL_ADMIN/metrics" |
        awk '$1 == "go_memstats_heap_inuse_bytes" { h = $2 } $1 == "go_goroutines" { g = $2 } END { printf "%.0f %d\n", h, g }'
}

leg_mem() {
    local sys=$1 before after open pb rb pa ra hb gb ha ga
    sleep "$SETTLE"
    read -r pb rb <<< "$(mem "$SYS_PID")"
    [ "$sys" = sluice ] && read -r hb gb <<< "$(gostats)"
    local iport=$SYS_WSS; [ "$IDLE_SCHEME" = ws ] && iport=$SYS_WS
    start "idle-$sys" "$GEN_CPUS" "$OUT/wsload" -mode idle -url "$IDLE_SCHEME://127.0.0.1:$iport/" -conns "$IDLE_CONNS" \
        -open-rate "$OPEN_RATE" -hold 30m
    local w=$LASTPID t=0
    until grep -q '^ready' "$OUT/idle-$sys.log"; do
        sleep 1; t=$((t + 1))
        [ "$t" -gt $((IDLE_CONNS / OPEN_RATE + 300)) ] && die "wsload idle: not ready after ${t}s (see $OUT/idle-$sys.log)"
    done
    open=$(sed -n 's/^ready open=\([0-9]*\).*/\1/p' "$OUT/idle-$sys.log")
    sleep "$SETTLE"
    read -r pa ra <<< "$(mem "$SYS_PID")"
    res "$sys" "mem.idle_${IDLE_SCHEME}_open" "$open/$IDLE_CONNS"
    if [ "$sys" = sluice ]; then
        # The Go heap in use (garbage of the handshakes not yet collected
        # included) and the goroutines: what of the PSS is sluice's own.
        read -r ha ga <<< "$(gostats)"
        res "$sys" mem.heap_inuse_bytes_before_after "$hb $ha"
        res "$sys" "mem.heap_inuse_bytes_per_idle_$IDLE_SCHEME" "$(awk -v a="$ha" -v b="$hb" -v n="${open:-0}" 'BEGIN { if (n > 0) printf "%.0f", (a - b) / n; else print "n/a" }')"
        res "$sys" mem.goroutines_before_after "$gb $ga"
    fi
    res "$sys" mem.pss_kb_before_after "$pb $pa"
    res "$sys" mem.rss_kb_before_after "$rb $ra"
    res "$sys" "mem.bytes_per_idle_$IDLE_SCHEME" "$(awk -v a="$pa" -v b="$pb" -v n="${open:-0}" 'BEGIN { if (n > 0) printf "%.0f", (a - b) * 1024 / n; else print "n/a" }')"
    stop "$w"
    # Connections the edge closed while they were held make the figure
    # worthless: recorded, and the table says so.
    res "$sys" mem.closed_by_edge "$(sed -n 's/^done .*closed_by_edge=\([0-9]*\).*/\1/p' "$OUT/idle-$sys.log" | grep . || echo '?')"
}

for sys in $SYSTEMS; do
    log "== $sys"
    start_system "$sys"
    printf 'foreground = yes\npid =\ndebug = 3\n[sip]\nclient = yes\naccept = 127.0.0.1:%s\nconnect = 127.0.0.1:%s\nverifyChain = no\n' \
        "$TUNNEL" "$SYS_TLS" > "$OUT/stunnel-$sys.conf"
    for m in $MODES; do
        case $m in
        tls) leg_tls "$sys" ;;
        ws) ladder "$sys" ws ;;
        mem) leg_mem "$sys" ;;
        esac
    done
    stop "$SYS_PID"
done

# ---------------------------------------------------------------- table
get() { awk -F'\t' -v s="$1" -v m="$2" '$1 == s && $2 == m { v = $3 } END { print (v == "" ? "-" : v) }' "$RES"; }
echo
echo "SIP edge, $(date -u +%Y-%m-%d), $(nproc) cores, LB_QUOTA=${LB_QUOTA:-none}% of CPU$LB_CPUS, EDGE_SECS=$EDGE_SECS, $(command -v kamailio >/dev/null && kamailio -v | head -1 | awk '{ print $2, $3 }' || echo "no Kamailio"), $(sipp -v 2>&1 | grep -m1 -o 'SIPp v[0-9.]*'), stunnel $(stunnel4 -version 2>&1 | grep -m1 -o 'stunnel [0-9.]*' | awk '{ print $2 }')"
echo
echo "| system | TLS max clean calls/s (SIPp via stunnel) | CPU at it | WS ($WS_SCHEME) max clean calls/s (wsload, $WS_CONNS conns) | CPU at it | bytes per idle ${IDLE_SCHEME^^} connection ($IDLE_CONNS) | PSS before → after (kB) |"
echo "|---|---|---|---|---|---|---|"
for sys in $SYSTEMS; do
    closed=$(get "$sys" mem.closed_by_edge); note=""
    [ "$closed" = 0 ] || [ "$closed" = - ] || note=" (INVALID: the edge closed $closed of them)"
    echo "| $sys | $(get "$sys" tls.max_clean_cps) | $(get "$sys" tls.lb_cpu_pct_at_max)% | $(get "$sys" ws.max_clean_cps) | $(get "$sys" ws.lb_cpu_pct_at_max)% | $(get "$sys" "mem.bytes_per_idle_$IDLE_SCHEME")$note | $(get "$sys" mem.pss_kb_before_after | sed 's/ / → /') |"
done
echo
log "results in $RES, logs in $OUT"
