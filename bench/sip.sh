#!/usr/bin/env bash
# SIP benchmark and interop legs for sluice, on loopback (127.0.0.1) only.
#
# usage: bench/sip.sh [sweep|ci|ci-overload|overload|all]      (default: sweep)
#   sweep     ../shared/peers/run.sh $SYSTEMS sip-target with sluice as the
#             third system: SIPp uac_rr.xml -> {Kamailio | sluice} udp :5060
#             -> SIPp uas_rr.xml on :5071/:5072, each balancer pinned to CPU0
#             and SIPp to CPU1; prints the highest clean call rate of every
#             system of the run (and Kamailio's from the peers' RESULTS.md)
#             and draws sip.png (clean calls/s and balancer CPU per call,
#             go run ./bench/plot) into OUT.
#   overload  run.sh sip-target-overload: uac_overload.xml at OVL_RATE
#             (600) calls/s against an INVITE limit of OVL_LIMIT (300)/s;
#             fails if any established call fails.
#   ci        short legs, no peers needed: 200 calls/s for 10 s with SIPp's
#             built-in uac/uas (no Record-Route awareness: the dialog table
#             routes ACK and BYE), again under round-robin (the INVITE's
#             backend is not the Call-ID hash's), with the record-route
#             scenarios, plus a short overload run;
#             fails on any failed call.
#   all       sweep, then overload.
# Knobs (env): PEERS=$ROOT/../shared/peers (the peers' harness)
#   SYSTEMS="sip-kamailio sip-kamailio-sl" (peers swept in the same run as
#   sluice; SYSTEMS="" for sluice alone, add sip-direct for the harness's
#   own ceiling) CI_RATE=200 CI_SECS=10 LB_PORT=5060 (the port Kamailio has in the peers run, so run.sh counts its drops)
#   LB_EXTRA="flags" (added to sluice's command line in sweep and ci, e.g.
#   "-sip-udp-batch 16")
#   OVL_LIMIT=300 OVL_RATE=600 OUT=$TMPDIR/sluice-bench/sip-<timestamp> and run.sh's own
#   (SIP_RATES, SIP_SECS, PIN, LB_CPUS, GEN_CPUS, ...).
# Every process is started by this script, bounded by `timeout`, and
# stopped by its PID.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
MODE=${1:-sweep}
PEERS=${PEERS:-$ROOT/../shared/peers}
SYSTEMS=${SYSTEMS-"sip-kamailio sip-kamailio-sl"}
# SIPp scenarios: the peers' copies, else ours (sip/testdata/sipp, the same
# files), so the ci leg runs on a clone without the peers' harness.
SCEN=$PEERS/sip
[ -f "$SCEN/uac_rr.xml" ] || SCEN=$ROOT/sip/testdata/sipp
CI_RATE=${CI_RATE:-200}
CI_SECS=${CI_SECS:-10}
LB_PORT=${LB_PORT:-5060}
OVL_LIMIT=${OVL_LIMIT:-300}
OVL_RATE=${OVL_RATE:-600}
OUT=${OUT:-${TMPDIR:-/tmp}/sluice-bench/sip-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd -P)
BIN=$OUT/sluice

log() { echo "[$(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v sipp >/dev/null || die "sipp not installed (scripts/install-test-deps.sh)"
log "building sluice into $BIN"
go build -o "$BIN" ./cmd/sluice || die "build failed"

# The sluice command line of every leg: UDP :LB_PORT, two UDP backends, no
# OPTIONS pings (SIPp answerers would count them as unexpected calls).
lb_cmd() {   # lb_cmd [extra flags...]
    echo "exec $BIN sip -sip-listen 127.0.0.1:$LB_PORT -sip-backend 127.0.0.1:5071 -sip-backend 127.0.0.1:5072" \
        "-sip-health-interval 0 -sip-udp-buffer 4194304 -affinity-key-file $OUT/affinity.key -data-dir $OUT/data -log-level warn $*"
}

STARTED=()
start() {   # start NAME CMD... (background, bounded, logged); sets LASTPID
    local name=$1; shift
    timeout -k 5 600 "$@" > "$OUT/$name.log" 2>&1 &
    LASTPID=$!
    STARTED+=("$LASTPID")
}
stop_all() {
    local p
    for p in "${STARTED[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${STARTED[@]}"; do wait "$p" 2>/dev/null; done
    STARTED=()
}
trap stop_all EXIT
wait_udp() { for _ in $(seq 100); do ss -Hlun "sport = :$1" | grep -q . && return 0; sleep 0.1; done; die "nothing on udp $1"; }
free_udp() { ss -Hlun "sport = :$1" | grep -q . && die "udp port $1 already in use"; return 0; }
csvcol() { awk -F';' -v c="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == c) k = i } END { print (k ? $k : "") }' "$1"; }

# ci_leg NAME UAS_ARGS UAC_ARGS: 2 answerers, sluice, one bounded UAC run.
FAILED=0
ci_leg() {
    local name=$1 uas=$2 uac=$3 dir=$OUT/$1 n=$((CI_RATE * CI_SECS)) ok fail p
    mkdir -p "$dir"
    for p in 5071 5072; do free_udp $p; done
    free_udp "$LB_PORT"
    for p in 5071 5072; do
        start "$name-uas$p" bash -c "cd $dir && exec sipp $uas -i 127.0.0.1 -p $p -nostdin -buff_size 1048576"
    done
    wait_udp 5071; wait_udp 5072
    start "$name-sluice" bash -c "$(lb_cmd "${LB_EXTRA:-}")"
    wait_udp "$LB_PORT"
    log "$name: sipp $uac at $CI_RATE calls/s for $n calls"
    (cd "$dir" && timeout $((CI_SECS + 60)) sipp "127.0.0.1:$LB_PORT" $uac -i 127.0.0.1 -p 5061 -r "$CI_RATE" -m "$n" \
        -nostdin -timeout $((CI_SECS + 40))s -recv_timeout 8000 -buff_size 1048576 -trace_stat -stf stat.csv -fd 1 \
        ${UAC_EXTRA:-} > uac.out 2>&1)
    ok=$(csvcol "$dir/stat.csv" 'SuccessfulCall(C)'); fail=$(csvcol "$dir/stat.csv" 'FailedCall(C)')
    log "$name: successful=${ok:-0} failed=${fail:-?} of $n retrans=$(csvcol "$dir/stat.csv" 'Retransmissions(C)')"
    if [ "${ok:-0}" != "$n" ] || [ "${fail:-1}" != 0 ]; then
        log "$name: FAILED (see $dir)"
        FAILED=1
    fi
    stop_all
}

# ci_overload: uac_overload.xml above an INVITE limit; every call must end
# cleanly (200 or 503), none may fail, and admission must hold the limit:
# the calls offered over S = n/OVL_RATE seconds are admitted at about
# OVL_LIMIT x S, between 0.8 x OVL_LIMIT x S (near-total refusal fails) and
# OVL_LIMIT x (S + 1) (the ARM window's bound: a rule may admit one unit's
# worth more at the edges of the run; more is over-admission).
ci_overload() {
    local dir=$OUT/ci-overload n=$((OVL_RATE * 5)) c200 c503 fail
    mkdir -p "$dir"
    for p in 5071 5072; do
        start "ovl-uas$p" bash -c "cd $dir && exec sipp -sf $SCEN/uas_rr.xml -i 127.0.0.1 -p $p -nostdin -buff_size 1048576"
    done
    wait_udp 5071; wait_udp 5072
    start "ovl-sluice" bash -c "$(lb_cmd "-arm name=invites,proto=sip,method=INVITE,limit=$OVL_LIMIT/s,action=reject")"
    wait_udp "$LB_PORT"
    log "ci-overload: uac_overload.xml at $OVL_RATE calls/s, limit $OVL_LIMIT/s, $n calls"
    (cd "$dir" && timeout 90 sipp "127.0.0.1:$LB_PORT" -sf "$SCEN/uac_overload.xml" -i 127.0.0.1 -p 5061 -r "$OVL_RATE" -m "$n" \
        -nostdin -timeout 60s -recv_timeout 8000 -buff_size 1048576 -trace_stat -stf stat.csv -fd 1 -trace_counts > uac.out 2>&1)
    local cnt; cnt=$(ls "$dir"/*_counts.csv 2>/dev/null | head -1)
    c200=$(csvcol "$cnt" 5_200_Recv); c503=$(csvcol "$cnt" 4_503_Recv); fail=$(csvcol "$dir/stat.csv" 'FailedCall(C)')
    log "ci-overload: 200=$c200 503=$c503 failed=$fail"
    local secs=$(( n / OVL_RATE )) lo hi
    lo=$(( OVL_LIMIT * secs * 8 / 10 )); hi=$(( OVL_LIMIT * (secs + 1) ))
    log "ci-overload: admitted $c200, want between $lo and $hi (limit $OVL_LIMIT/s over ${secs}s)"
    if [ "${fail:-1}" != 0 ] || [ "${c503:-0}" = 0 ] || [ $(( ${c200:-0} + ${c503:-0} )) != "$n" ] \
        || [ "${c200:-0}" -lt "$lo" ] || [ "${c200:-0}" -gt "$hi" ]; then
        log "ci-overload: FAILED (see $dir)"
        FAILED=1
    fi
    stop_all
}

need_peers() { [ -x "$PEERS/run.sh" ] || die "no $PEERS/run.sh (the peers' harness; set PEERS)"; }

kamailio_figure() {   # kamailio_figure 'sip-kamailio (tm' -> "4,000"
    grep -F "| $1" "$PEERS/RESULTS.md" | grep -o '\*\*[0-9,]*\*\*' | head -1 | tr -d '*'
}

sweep() {
    need_peers
    log "sweep: $PEERS/run.sh $SYSTEMS sip-target 127.0.0.1:$LB_PORT (each balancer pinned to CPU${LB_CPUS:-0}; sluice's GOMAXPROCS follows the pinning)"
    # shellcheck disable=SC2086
    LB_SIP_ADDR=127.0.0.1:$LB_PORT LB_SIP_CMD="$(lb_cmd "${LB_EXTRA:-}")" OUT=$OUT/sweep "$PEERS/run.sh" $SYSTEMS sip-target "127.0.0.1:$LB_PORT" \
        2>&1 | tee "$OUT/sweep.log"
    local res=$OUT/sweep/results.tsv s
    [ -s "$res" ] || die "no results in $res (see $OUT/sweep.log)"
    echo
    echo "== SIP, highest clean call rate (all calls succeed, no retransmissions), ${SIP_SECS:-10} s per point"
    for s in sip-target $SYSTEMS; do
        printf '%-48s %s calls/s\n' "$(sys_name "$s"), this run" \
            "$(awk -F'\t' -v s="$s" '$1 == s && $2 == "max_clean_cps" { print $3 }' "$res" | grep . || echo '?')"
    done
    printf '%-48s %s calls/s\n' "Kamailio stateful (tm), peers' RESULTS.md" "$(kamailio_figure 'sip-kamailio (tm')"
    printf '%-48s %s calls/s\n' "Kamailio stateless, peers' RESULTS.md" "$(kamailio_figure 'sip-kamailio-sl')"
    grep -E '^sip-' "$res" | sed 's/^/  /'
    charts
}

sys_name() {   # sys_name sip-target -> the name the summary prints
    case $1 in
        sip-target) echo "sluice (stateful new work, stateless in-dialog)" ;;
        sip-kamailio) echo "Kamailio stateful (tm)" ;;
        sip-kamailio-sl) echo "Kamailio stateless" ;;
        *) echo "$1" ;;
    esac
}

# charts: sip.png (clean calls/s and balancer CPU per call per system) into
# OUT. A failure to draw is reported but does not fail the measured run.
charts() {
    log "charts: go run ./bench/plot -in $OUT"
    go run ./bench/plot -in "$OUT" || log "WARNING: no charts drawn (the results above stand; rerun: go run ./bench/plot -in $OUT)"
}

overload() {
    need_peers
    LB_SIP_ADDR=127.0.0.1:$LB_PORT OVL_LIMIT=$OVL_LIMIT OVL_RATE=$OVL_RATE \
        LB_SIP_CMD="$(lb_cmd "-arm name=invites,proto=sip,method=INVITE,limit=$OVL_LIMIT/s,action=reject")" \
        OUT=$OUT/overload "$PEERS/run.sh" sip-target-overload "127.0.0.1:$LB_PORT" 2>&1 | tee "$OUT/overload.log"
    local f
    f=$(awk -F'\t' '$1 == "sip-target-overload" && $2 == "failed_calls" { print $3 }' "$OUT/overload/results.tsv")
    echo "overload: failed calls: ${f:-?}"
    case $f in 0*) ;; *) FAILED=1 ;; esac
}

case $MODE in
    ci)
        ci_leg ci-builtin "-sn uas" "-sn uac"
        LB_EXTRA="-sip-lb-policy round-robin" ci_leg ci-builtin-round-robin "-sn uas" "-sn uac"
        ci_leg ci-record-route "-sf $SCEN/uas_rr.xml" "-sf $SCEN/uac_rr.xml"
        ci_overload ;;
    ci-overload) ci_overload ;;
    sweep) sweep ;;
    overload) overload ;;
    all) sweep; overload ;;
    *) die "unknown mode $MODE (sweep, ci, overload, all)" ;;
esac
[ "$FAILED" = 0 ] || { log "FAILED"; exit 1; }
log "ok (logs in $OUT)"
