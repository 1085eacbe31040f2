#!/usr/bin/env bash
# Hostile SIP under a call load, on loopback (127.0.0.1) only.
#
# usage: bench/flood.sh [RATE...]        (default: 20000 0)
#   For each RATE (datagrams/s; 0 = as fast as one socket goes): SIPp
#   uac_rr.xml at CALL_RATE calls/s through `sluice run` to two SIPp
#   answerers for PRE + FLOOD_SECS + POST seconds; bench/sipflood sends
#   garbage, truncated, mangled, oversize and stray datagrams for FLOOD_SECS
#   starting PRE seconds in. Prints per leg: calls ok/failed, the kernel's
#   UDP receive-buffer drops (/proc/net/snmp RcvbufErrors), sluice's
#   malformed counters, its peak RSS and goroutines during the flood, the
#   admin /healthz answers during the flood (count, slowest), and whether a
#   call placed after the flood completes.
# Knobs (env): CALL_RATE=100 FLOOD_SECS=30 PRE=5 POST=5 LB_PORT=5260 (answerers on
#   LB_PORT+11 and +12, SIPp clients on +1 and +2)
#   ADMIN_PORT=9190 OUT=$TMPDIR/sluice-bench/flood-<timestamp>
# Every process is started here, bounded by `timeout`, and stopped by PID.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
RATES=("$@"); [ ${#RATES[@]} -gt 0 ] || RATES=(20000 0)
CALL_RATE=${CALL_RATE:-100}
FLOOD_SECS=${FLOOD_SECS:-30}
PRE=${PRE:-5}
POST=${POST:-5}
LB_PORT=${LB_PORT:-5260}
UAS1=$((LB_PORT + 11)) UAS2=$((LB_PORT + 12)) UAC=$((LB_PORT + 1)) UAC2=$((LB_PORT + 2))
ADMIN_PORT=${ADMIN_PORT:-9190}
SCEN=$ROOT/sip/testdata/sipp
OUT=${OUT:-${TMPDIR:-/tmp}/sluice-bench/flood-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd -P)

log() { echo "[$(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
command -v sipp >/dev/null || die "sipp not installed (scripts/install-test-deps.sh)"
go build -o "$OUT/sluice" ./cmd/sluice || die "build sluice"
go build -o "$OUT/sipflood" ./bench/sipflood || die "build sipflood"

STARTED=()
start() {   # start NAME CMD...; sets LASTPID
    local name=$1; shift
    timeout -k 5 600 "$@" > "$OUT/$name.log" 2>&1 &
    LASTPID=$!; STARTED+=("$LASTPID")
}
stop_all() {
    local p
    for p in "${STARTED[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${STARTED[@]}"; do wait "$p" 2>/dev/null; done
    STARTED=()
}
trap stop_all EXIT
wait_udp() { for _ in $(seq 100); do ss -Hlun "sport = :$1" | grep -q . && return 0; sleep 0.1; done; die "nothing on udp $1"; }
csvcol() { awk -F';' -v c="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == c) k = i } END { print (k ? $k : "") }' "$1"; }
rcvbuf_errors() { awk '/^Udp:/ { if (!h) { for (i = 1; i <= NF; i++) if ($i == "RcvbufErrors") k = i; h = 1 } else print $k }' /proc/net/snmp; }
metric() { curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }

leg() {
    local rate=$1 dir=$OUT/rate-$1 secs=$((PRE + FLOOD_SECS + POST)) n lbpid d0 d1 ok fail
    mkdir -p "$dir"; n=$((CALL_RATE * secs))
    for p in $UAS1 $UAS2; do
        start "uas$p-$rate" bash -c "cd $dir && exec sipp -sf $SCEN/uas_rr.xml -i 127.0.0.1 -p $p -nostdin -buff_size 4194304"
    done
    wait_udp $UAS1; wait_udp $UAS2
    start "sluice-$rate" "$OUT/sluice" run -sip-listen "127.0.0.1:$LB_PORT" -sip-backend 127.0.0.1:$UAS1 -sip-backend 127.0.0.1:$UAS2 \
        -sip-health-interval 0 -sip-udp-buffer 4194304 -sip-max-message 16384 -http-listen "" \
        -admin-listen "127.0.0.1:$ADMIN_PORT" -data-dir "$dir/data" -log-level warn
    wait_udp "$LB_PORT"
    lbpid=$(cat "/proc/$LASTPID/task/$LASTPID/children" | awk '{ print $1 }')   # sluice under timeout
    log "rate $rate: $n calls at $CALL_RATE/s; flood from ${PRE}s for ${FLOOD_SECS}s"
    (cd "$dir" && timeout $((secs + 60)) sipp "127.0.0.1:$LB_PORT" -sf "$SCEN/uac_rr.xml" -i 127.0.0.1 -p $UAC -r "$CALL_RATE" -m "$n" \
        -nostdin -timeout $((secs + 40))s -recv_timeout 8000 -buff_size 4194304 -trace_stat -stf stat.csv -fd 1 > uac.out 2>&1) &
    local uacpid=$!
    sleep "$PRE"
    d0=$(rcvbuf_errors)
    "$OUT/sipflood" -addr "127.0.0.1:$LB_PORT" -rate "$rate" -duration "${FLOOD_SECS}s" > "$dir/flood.out" 2>&1 &
    local flpid=$! hz=0 hzbad=0 slow=0 rss=0 gor=0 t0 t1 ms code r g
    while kill -0 "$flpid" 2>/dev/null; do
        t0=$(date +%s%N)
        code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$ADMIN_PORT/healthz")
        t1=$(date +%s%N); ms=$(((t1 - t0) / 1000000))
        hz=$((hz + 1)); [ "$code" = 200 ] || hzbad=$((hzbad + 1)); [ "$ms" -gt "$slow" ] && slow=$ms
        r=$(awk '/^VmRSS/ { print $2 }' "/proc/$lbpid/status" 2>/dev/null || echo 0)
        [ "${r:-0}" -gt "$rss" ] && rss=$r
        g=$(metric go_goroutines); g=${g%.*}; [ "${g:-0}" -gt "$gor" ] && gor=$g
        sleep 1
    done
    wait "$flpid"
    d1=$(rcvbuf_errors)
    wait "$uacpid"
    ok=$(csvcol "$dir/stat.csv" 'SuccessfulCall(C)'); fail=$(csvcol "$dir/stat.csv" 'FailedCall(C)')
    # A call after the flood: SIPp's built-in uac, 5 calls.
    local after
    after=$(cd "$dir" && timeout 30 sipp "127.0.0.1:$LB_PORT" -sf "$SCEN/uac_rr.xml" -i 127.0.0.1 -p $UAC2 -m 5 -r 5 -nostdin \
        -timeout 20s -trace_stat -stf after.csv > after.out 2>&1; csvcol after.csv 'SuccessfulCall(C)')
    printf 'rate=%s flood: %s\n' "$rate" "$(cat "$dir/flood.out")"
    printf '  calls ok=%s failed=%s of %s (retransmissions %s); kernel UDP receive-buffer drops during the flood %s\n' \
        "${ok:-?}" "${fail:-?}" "$n" "$(csvcol "$dir/stat.csv" 'Retransmissions(C)')" "$((d1 - d0))"
    printf '  sluice: malformed %s, 400 sent %s, dropped unanswered %s, oversize %s, stray responses %s, panics logged %s\n' \
        "$(metric 'sluice_frontend_events_total{event="malformed",protocol="sip"}')" "$(metric 'sluice_frontend_events_total{event="bad_requests",protocol="sip"}')" "$(metric 'sluice_frontend_events_total{event="malformed_dropped",protocol="sip"}')" \
        "$(metric 'sluice_frontend_events_total{event="oversize",protocol="sip"}')" "$(metric 'sluice_frontend_events_total{event="stray_responses",protocol="sip"}')" "$(grep -c panic "$OUT/sluice-$rate.log")"
    printf '  peak RSS %s kB, peak goroutines %s; /healthz during the flood: %s answers, %s not 200, slowest %s ms; calls after the flood: %s of 5\n' \
        "$rss" "$gor" "$hz" "$hzbad" "$slow" "${after:-0}"
    stop_all
}
for r in "${RATES[@]}"; do leg "$r"; done
log "logs in $OUT"
