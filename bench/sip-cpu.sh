#!/usr/bin/env bash
# SIP CPU per call of sluice, on loopback, at a fixed offered rate.
#
# usage: bench/sip-cpu.sh [one|ab|vs-kamailio|side-kamailio|curve]     (default: one)
#   one   builds sluice from this tree (or takes BIN=path) and runs it RUNS
#         times: each run is sluice pinned to LB_CPU, two SIPp uas_rr.xml
#         answerers and one SIPp uac_rr.xml client pinned to GEN_CPU, RATE
#         calls/s for SECS seconds. Prints per run sluice's CPU (utime +
#         stime from /proc/PID/stat, read just before the client starts and
#         just after it ends, with its store process's: a call's dialog is
#         written there) divided by the completed calls, the failed
#         calls and the retransmissions, then the median. Each run's line
#         also gives the child processes' part of the CPU per call (the
#         store process's for sluice, the workers' for Kamailio).
#   ab    BASE=path NEW=path (two sluice binaries; BASE=REV builds git
#         revision REV, NEW defaults to this tree): RUNS runs of each,
#         interleaved BASE NEW BASE NEW ..., then the median of each and
#         NEW/BASE. The machine is shared and noisy: only interleaved
#         ratios mean anything. BASE_EXTRA / NEW_EXTRA add flags to one
#         side only (BASE=NEW with NEW_EXTRA="-access-log FILE" is what a
#         flag costs).
#   vs-kamailio
#         Kamailio stateless (../shared/peers/conf/kamailio-lb.cfg with
#         -A STATELESS, one UDP worker, the ports rewritten to these) and
#         sluice (NEW, default this tree) interleaved, RUNS each, in the
#         same harness; Kamailio's CPU is that of all its processes. Prints
#         the medians and kamailio/sluice (above 1: sluice is cheaper).
#   side-kamailio
#         Kamailio stateless and sluice (NEW, default this tree) side by
#         side: both running at once on LB_CPU, each with its own SIPp
#         client at RATE (the two answerers shared), RUNS runs. CPU of each
#         over the same seconds, so a change of the machine's speed (this
#         one moves by ±30 % within an hour) hits both alike; the interleaved
#         vs-kamailio pairs spread 0.75-1.37 for that reason. Prints each
#         run's kamailio/sluice and their median. With BASE (a path or a
#         revision), each run of NEW follows one of BASE, and the pairs'
#         NEW ratio / BASE ratio is printed too (bench/perf.sh's peer leg).
#   curve the cost curves of issue 25: sluice's CPU per call (NEW, default
#         this tree) as its dialog table grows (DIALOG_NS="0 100000
#         1000000" live dialogs, written into the data directory by
#         bench/dialogfill before sluice starts, which restores them), and
#         with the SIPp client over TCP (CLIENT_NS="10 10000" connections,
#         `-t tn -max_socket N`) against UDP; Kamailio stateless on the
#         transport axis too (KAMAILIO=0 leaves it out; it keeps no
#         dialogs, so it has no place on the dialog axis). RUNS rounds, the
#         points interleaved within each. CPU is counted after WARM
#         seconds of the client's run (the TCP connections are open by
#         then) to its end, against the calls SIPp completed in that
#         window (its -trace_stat lines, once a second). Also the resident
#         memory (RSS) of sluice and its store process with the dialogs
#         restored, before the load. The summary's medians take the runs
#         without a failed call only (runs: how many). Writes OUT/curve.tsv and
#         OUT/curve-summary.tsv, and the charts with
#         `go run ./bench/plot sipcurve OUT/curve-summary.tsv bench/img`.
# Knobs (env): RATE=2000 SECS=10 RUNS=3 LB_CPU=0 GEN_CPU=1
#   LB_QUOTA= (e.g. 50: sluice in a cgroup capped at that % of one core;
#   needs a writable cgroup fs) PORT_BASE=15060 (sluice PORT_BASE, client
#   PORT_BASE+1, answerers PORT_BASE+11 and +12, admin PORT_BASE+30; side-kamailio:
#   Kamailio PORT_BASE+2, its client PORT_BASE+3; apart from bench/sip.sh's
#   5060.. so both may run) PROFILE=1 (the last NEW/one run also writes
#   sluice's -cpuprofile to OUT/cpu.prof) PERF=1 (the last NEW/one run is
#   recorded by perf record -g into OUT/perf.data) BUSY=1 (a busy loop
#   pinned to LB_CPU during each run: the competing load of RELIABILITY.md
#   3l) NICE= (e.g. -5: sluice and SIPp run at that nice level, so other
#   work on a shared machine disturbs the figures less; root only)
#   LB_EXTRA="flags" WARM=4 (curve) DIALOG_NS CLIENT_NS KAMAILIO=1
#   OUT=$TMPDIR/sluice-bench/sip-cpu-<timestamp>.
# Every process is started by this script, bounded by `timeout`, and
# stopped by its PID. A run lasts SECS + a few seconds.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
MODE=${1:-one}
RATE=${RATE:-2000}
SECS=${SECS:-10}
RUNS=${RUNS:-3}
LB_CPU=${LB_CPU:-0}
GEN_CPU=${GEN_CPU:-1}
LB_QUOTA=${LB_QUOTA:-}
PORT_BASE=${PORT_BASE:-15060}
LB_PORT=$PORT_BASE
UAC_PORT=$((PORT_BASE + 1))
UAS1=$((PORT_BASE + 11))
UAS2=$((PORT_BASE + 12))
SCEN=$ROOT/sip/testdata/sipp
OUT=${OUT:-${TMPDIR:-/tmp}/sluice-bench/sip-cpu-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd -P)
HZ=$(getconf CLK_TCK)

log() { echo "[$(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
command -v sipp >/dev/null || die "sipp not installed (scripts/install-test-deps.sh)"
case $RATE$SECS$RUNS in *[!0-9]*) die "RATE, SECS and RUNS must be whole numbers (got RATE=$RATE SECS=$SECS RUNS=$RUNS)" ;; esac
[ "$SECS" -le 15 ] || die "SECS=$SECS: at most 15 s per run (the machine is shared)"

STARTED=()
start() {   # start NAME CPU CMD... (background, pinned, bounded, logged); sets LASTPID
    local name=$1 cpu=$2; shift 2
    local nice=()
    [ -n "${NICE:-}" ] && nice=(nice -n "$NICE")
    "${nice[@]}" taskset -c "$cpu" timeout -k 5 "${LIFETIME:-300}" "$@" > "$OUT/$name.log" 2>&1 &
    LASTPID=$!
    STARTED+=("$LASTPID")
}
stop() {   # stop PID: TERM, wait, and forget it
    kill -TERM "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    local keep=() p
    for p in "${STARTED[@]}"; do [ "$p" != "$1" ] && keep+=("$p"); done
    STARTED=("${keep[@]}")
}
stop_all() { local p; for p in "${STARTED[@]}"; do kill -TERM "$p" 2>/dev/null; done; for p in "${STARTED[@]}"; do wait "$p" 2>/dev/null; done; STARTED=(); }
CGROUPS=()
# rm_cgroups: remove the cgroups made here once empty (the store process
# outlives sluice by up to 2 s to commit what it was sent).
rm_cgroups() { local g; for g in "${CGROUPS[@]}"; do for _ in $(seq 50); do rmdir "$g" 2>/dev/null && break; sleep 0.1; done; done; }
trap 'stop_all; rm_cgroups' EXIT
wait_udp() { for _ in $(seq 100); do ss -Hlun "sport = :$1" | grep -q . && return 0; sleep 0.1; done; die "nothing on udp $1"; }
free_udp() { ss -Hlun "sport = :$1" | grep -q . && die "udp port $1 already in use (set PORT_BASE)"; return 0; }
csvcol() { awk -F';' -v c="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == c) k = i } END { print (k ? $k : "") }' "$1"; }
# ticks PID: utime + stime of PID (all its threads) and of its child
# processes still running (Kamailio's workers), in clock ticks.
ticks() {
    local p t=0
    for p in "$1" $(pgrep -P "$1"); do
        t=$((t + $(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    echo "$t"
}
# kids PID: utime + stime of PID's child processes alone (sluice's store
# process; Kamailio's workers), in clock ticks.
kids() {
    local p t=0
    for p in $(pgrep -P "$1"); do
        t=$((t + $(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    echo "$t"
}
# lbpid PID: the sluice process under timeout/taskset (the child of timeout).
lbpid() { local c; for _ in $(seq 50); do c=$(pgrep -P "$1" | head -1); [ -n "$c" ] && { echo "$c"; return; }; sleep 0.1; done; echo "$1"; }

build() {   # build DEST [REV]: sluice of this tree, or of git revision REV
    if [ -n "${2:-}" ]; then
        local wt=$OUT/src-$2
        git worktree add --detach "$wt" "$2" >/dev/null 2>&1 || die "cannot check out $2"
        (cd "$wt" && go build -o "$1" ./cmd/sluice) || die "build of $2 failed"
        git worktree remove --force "$wt"
    else
        go build -o "$1" ./cmd/sluice || die "build failed"
    fi
}
binary() {   # binary NAME SPEC: SPEC is a file (used as is), a git revision (built) or "" (this tree)
    local dest=$OUT/sluice-$1
    if [ -n "$2" ] && [ -x "$2" ]; then cp "$2" "$dest"; else log "building $1 ${2:-(this tree)}"; build "$dest" "$2"; fi
    echo "$dest"
}

answerers() {
    for p in $UAS1 $UAS2 $LB_PORT $UAC_PORT; do free_udp "$p"; done
    for p in $UAS1 $UAS2; do
        start "uas$p" "$GEN_CPU" bash -c "cd $OUT && exec sipp -sf $SCEN/uas_rr.xml -i 127.0.0.1 -p $p -nostdin -recv_timeout 10000 -buff_size 4194304"
    done
    wait_udp "$UAS1"; wait_udp "$UAS2"
}

quota() {   # quota PID: put PID in a cgroup capped at LB_QUOTA % of one core
    [ -n "$LB_QUOTA" ] || return 0
    local g p
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        g=/sys/fs/cgroup/sluice-sip-cpu-$$
        mkdir -p "$g" && echo "$((LB_QUOTA * 100)) 10000" > "$g/cpu.max" || die "LB_QUOTA=$LB_QUOTA: cannot make $g (root needed)"
    else
        g=/sys/fs/cgroup/cpu/sluice-sip-cpu-$$
        mkdir -p "$g" && echo 10000 > "$g/cpu.cfs_period_us" && echo "$((LB_QUOTA * 100))" > "$g/cpu.cfs_quota_us" \
            || die "LB_QUOTA=$LB_QUOTA: cannot make $g (cgroup v1 cpu controller, root needed)"
    fi
    CGROUPS+=("$g")
    for p in "$1" $(pgrep -P "$1"); do echo "$p" > "$g/cgroup.procs" || die "LB_QUOTA: cannot move pid $p into $g"; done
}

# start_kamailio NAME DIR: the Kamailio of OUT/kamailio.cfg (kamailio_conf)
# on LB_CPU, stateless, one UDP worker, its runtime files in DIR.
start_kamailio() {
    mkdir -p "$2"
    start "$1" "$LB_CPU" kamailio -f "$OUT/kamailio.cfg" -DD -E -Y "$2" -m 2048 -M 16 \
        -A "DSLIST=\"$OUT/dispatcher.list\"" -A CHILDREN=1 -A MAXBUF=4194304 -A STATELESS
}
# start_sluice NAME BIN DATADIR EXTRA...: sluice on LB_CPU, listening on
# LB_PORT, the two answerers its backends.
start_sluice() {
    local name=$1 bin=$2 data=$3
    shift 3
    start "$name" "$LB_CPU" "$bin" sip -sip-listen 127.0.0.1:$LB_PORT \
        -sip-backend 127.0.0.1:$UAS1 -sip-backend 127.0.0.1:$UAS2 -sip-health-interval 0 -sip-udp-buffer 4194304 \
        -affinity-key-file "$OUT/affinity.key" -data-dir "$data" -admin-listen 127.0.0.1:$((PORT_BASE + 30)) -log-level warn ${LB_EXTRA:-} "$@"
}
# uac DIR TARGET_PORT OWN_PORT CALLS: the SIPp uac_rr.xml client on
# GEN_CPU at RATE, until CALLS calls are done; DIR gets stat.csv.
uac() {
    (cd "$1" && ${NICE:+nice -n "$NICE"} taskset -c "$GEN_CPU" timeout $((SECS + 40)) sipp "127.0.0.1:$2" -sf "$SCEN/uac_rr.xml" \
        -i 127.0.0.1 -p "$3" -r "$RATE" -m "$4" -nostdin -timeout $((SECS + 30))s -recv_timeout 8000 \
        -buff_size 4194304 -trace_stat -stf stat.csv -fd 1 > uac.out 2>&1)
}

# run N NAME BIN EXTRA...: measured run number N; prints "us_per_call ok failed retrans cpu%".
run() {
    local RUN=$1 name=$2 bin=$3; shift 3
    local dir=$OUT/$RUN-$name n=$((RATE * SECS))
    mkdir -p "$dir"
    if [ "$bin" = kamailio ]; then
        kamailio_conf
        start_kamailio "$RUN-$name-kamailio" "$dir/kam"
    else
        start_sluice "$RUN-$name-sluice" "$bin" "$dir/data" "$@"
    fi
    local tpid=$LASTPID pid
    wait_udp "$LB_PORT"
    pid=$(lbpid "$tpid")
    quota "$pid"
    PERFPID=
    if [ "${PERF_NEXT:-0}" = 1 ]; then
        timeout -s INT $((SECS + 45)) perf record -g -o "$OUT/perf.data" -p "$pid" > "$OUT/perf.log" 2>&1 &
        PERFPID=$!
    fi
    local t0 t1 k0 k1 w0 w1 busy=
    if [ "${BUSY:-0}" = 1 ]; then
        taskset -c "$LB_CPU" timeout $((SECS + 45)) sh -c 'while :; do :; done' &
        busy=$!
    fi
    t0=$(ticks "$pid"); k0=$(kids "$pid"); w0=$(date +%s%N)
    uac "$dir" "$LB_PORT" "$UAC_PORT" "$n"
    t1=$(ticks "$pid"); k1=$(kids "$pid"); w1=$(date +%s%N)
    if [ -n "$busy" ]; then kill "$busy"; wait "$busy" 2>/dev/null; fi
    if [ -n "${PERFPID:-}" ]; then kill -INT "$PERFPID"; wait "$PERFPID" 2>/dev/null; PERFPID=; fi
    stop "$tpid"
    local ok fail re
    ok=$(csvcol "$dir/stat.csv" 'SuccessfulCall(C)'); fail=$(csvcol "$dir/stat.csv" 'FailedCall(C)')
    re=$(csvcol "$dir/stat.csv" 'Retransmissions(C)')
    awk -v t=$((t1 - t0)) -v k=$((k1 - k0)) -v hz="$HZ" -v ok="${ok:-0}" -v f="${fail:-?}" -v r="${re:-?}" -v w=$((w1 - w0)) \
        'BEGIN { us = ok > 0 ? t / hz * 1e6 / ok : 0; ku = ok > 0 ? k / hz * 1e6 / ok : 0
                 printf "%.1f %d %s %s %.0f %.1f\n", us, ok, f, r, t / hz * 1e9 / w * 100, ku }'
}

# stat1 PID: utime + stime of one process, in clock ticks (bash only: the
# sampler below reads it ten times a second).
stat1() {
    local line f
    read -r line < "/proc/$1/stat" 2>/dev/null || { echo 0; return; }
    line=${line##*) }
    read -r -a f <<< "$line"
    echo $((f[11] + f[12]))
}
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

# crun N NAME BIN DIALOGS CONNS: one point of the curves. BIN is a sluice
# binary or "kamailio"; DIALOGS live dialogs are written into the data
# directory first; CONNS 0 is a UDP client, else SIPp over TCP with that
# many connections. Prints "us_per_call calls failed retrans cpu% rss_kb store_rss_kb".
crun() {
    local RUN=$1 name=$2 bin=$3 dialogs=$4 conns=$5
    local dir=$OUT/$RUN-$name n=$((RATE * SECS)) pids=() p
    mkdir -p "$dir"
    if [ "$bin" = kamailio ]; then
        kamailio_conf "$conns"
        start_kamailio "$RUN-$name-kamailio" "$dir/kam"
    else
        if [ "$dialogs" -gt 0 ]; then
            "$DIALOGFILL" -sluice "$bin" -dir "$dir/data" -n "$dialogs" -backend "127.0.0.1:$UAS1" -backend "127.0.0.1:$UAS2" \
                > "$dir/dialogfill.log" 2>&1 || die "dialogfill: $(tail -3 "$dir/dialogfill.log")"
        fi
        start_sluice "$RUN-$name-sluice" "$bin" "$dir/data" -sip-tcp-max-conns 15000 -sip-tcp-max-conns-per-source 15000
    fi
    local tpid=$LASTPID pid
    wait_udp "$LB_PORT"
    pid=$(lbpid "$tpid")
    pids=("$pid" $(pgrep -P "$pid"))   # Kamailio's workers; sluice's store process
    quota "$pid"
    sleep 1
    local rss store_rss=0
    rss=$(rss_kb "$pid")
    for p in "${pids[@]:1}"; do store_rss=$((store_rss + $(rss_kb "$p"))); done
    # The sampler: wall time and the CPU ticks of every process of the
    # system under test, ten times a second, on the generator's core.
    taskset -c "$GEN_CPU" bash -c '
        stat1() { local line f; read -r line < "/proc/$1/stat" 2>/dev/null || { echo 0; return; }; line=${line##*) }; read -r -a f <<< "$line"; echo $((f[11] + f[12])); }
        while :; do t=0; for p in '"${pids[*]}"'; do t=$((t + $(stat1 $p))); done; echo "$EPOCHREALTIME $t"; sleep 0.1; done' > "$dir/ticks.txt" &
    local sampler=$!
    if [ "$conns" -gt 0 ]; then
        # TCP: bench/sipload, the calls spread over CONNS connections
        # opened before the first call (SIPp cannot: see its doc comment).
        (cd "$dir" && ${NICE:+nice -n "$NICE"} taskset -c "$GEN_CPU" timeout $((SECS + 40)) "$SIPLOAD" -addr "127.0.0.1:$LB_PORT" \
            -conns "$conns" -rate "$RATE" -calls "$n" > uac.out 2>&1)
    else
        uac "$dir" "$LB_PORT" "$UAC_PORT" "$n"
        # The same lines as sipload's: stat EPOCH SUCCESSFUL FAILED RETRANS.
        awk -F';' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
            { split($c["CurrentTime"], t, "\t"); print "stat", t[3], $c["SuccessfulCall(C)"], $c["FailedCall(C)"], $c["Retransmissions(C)"] }' \
            "$dir/stat.csv" >> "$dir/uac.out"
    fi
    sleep 0.3
    kill "$sampler"; wait "$sampler" 2>/dev/null
    stop "$tpid"
    # The window: the first stat line at least WARM seconds after the
    # first to the last; the CPU in it is the sampled ticks interpolated
    # at those two instants.
    awk -v warm="${WARM:-4}" -v hz="$HZ" -v rss="$rss" -v srss="$store_rss" -v ticks="$dir/ticks.txt" '
        function at(t,   i) {   # ticks at epoch t, interpolated
            for (i = 2; i <= ns; i++) if (st[i] >= t) return sv[i-1] + (sv[i] - sv[i-1]) * (t - st[i-1]) / (st[i] - st[i-1])
            return sv[ns]
        }
        BEGIN { while ((getline l < ticks) > 0) { split(l, a, " "); ns++; st[ns] = a[1]; sv[ns] = a[2] } }
        $1 != "stat" { next }
        { if (!first) first = $2
          if (!t0 && $2 - first >= warm) { t0 = $2; s0 = $3 }
          t1 = $2; s1 = $3; f = $4; r = ($5 == "" ? 0 : $5) }
        END {
            calls = s1 - s0; cpu = at(t1) - at(t0)
            us = calls > 0 ? cpu / hz * 1e6 / calls : 0
            printf "%.1f %d %s %s %.0f %d %d\n", us, calls, f + 0, r + 0, (t1 > t0 ? cpu / hz / (t1 - t0) * 100 : 0), rss, srss
        }' "$dir/uac.out"
}

# kamailio_conf: the peers' stateless Kamailio configuration with this
# run's ports (listen on LB_PORT, dispatcher set 1 = the two answerers).
kamailio_conf() {   # kamailio_conf [TCP_CONNS]: with TCP_CONNS > 0, a TCP listener too
    local src=${PEERS:-$ROOT/../shared/peers}/conf/kamailio-lb.cfg LB_PORT=${KAM_PORT:-$LB_PORT}
    [ -r "$src" ] || die "no $src (PEERS=path of the peers' harness)"
    command -v kamailio > /dev/null || die "kamailio not installed (scripts/install-test-deps.sh)"
    sed "s/^listen=udp:127.0.0.1:5060\$/listen=udp:127.0.0.1:$LB_PORT/" "$src" > "$OUT/kamailio.cfg"
    if [ "${1:-0}" -gt 0 ]; then
        # TCP clients: one TCP worker (as the one UDP worker), room for the
        # connections, and answers sent back on the client's connection
        # (force_rport: its source port, not the Via's listening port).
        sed -i -e "s/^disable_tcp=yes\$/disable_tcp=no\nlisten=tcp:127.0.0.1:$LB_PORT\ntcp_children=1\ntcp_max_connections=20000\ntcp_connection_lifetime=3600\nopen_files_limit=20000/" \
            -e 's/^request_route {$/request_route {\n\tforce_rport();/' "$OUT/kamailio.cfg"
        grep -q "^listen=tcp:127.0.0.1:$LB_PORT\$" "$OUT/kamailio.cfg" && grep -q 'force_rport' "$OUT/kamailio.cfg" \
            || die "cannot add Kamailio's TCP listener in $OUT/kamailio.cfg"
    fi
    grep -q "^listen=udp:127.0.0.1:$LB_PORT\$" "$OUT/kamailio.cfg" || die "cannot set Kamailio's listen port in $OUT/kamailio.cfg"
    printf '1 sip:127.0.0.1:%s\n1 sip:127.0.0.1:%s\n' "$UAS1" "$UAS2" > "$OUT/dispatcher.list"
}

# side N BIN EXTRA...: Kamailio stateless and sluice (BIN, with EXTRA
# flags) at once, each with its own client; prints "kam_us kam_ok kam_failed kam_retrans sluice_us sluice_ok
# sluice_failed sluice_retrans kamailio/sluice".
side() {
    local RUN=$1 bin=$2 dir=$OUT/$1-side n=$((RATE * SECS)) kt st kp sp k0 k1 s0 s1 c1 c2
    shift 2
    mkdir -p "$dir/sluice" "$dir/kam-uac" "$dir/sluice-uac"
    KAM_PORT=$KAM_PORT kamailio_conf
    start_kamailio "$RUN-side-kamailio" "$dir/kam"
    kt=$LASTPID
    start_sluice "$RUN-side-sluice" "$bin" "$dir/sluice/data" "$@"
    st=$LASTPID
    wait_udp "$KAM_PORT"; wait_udp "$LB_PORT"
    kp=$(lbpid "$kt"); sp=$(lbpid "$st")
    k0=$(ticks "$kp"); s0=$(ticks "$sp")
    uac "$dir/kam-uac" "$KAM_PORT" "$KAM_UAC" "$n" & c1=$!
    uac "$dir/sluice-uac" "$LB_PORT" "$UAC_PORT" "$n" & c2=$!
    wait "$c1" "$c2"
    k1=$(ticks "$kp"); s1=$(ticks "$sp")
    stop "$kt"; stop "$st"
    local kok kf kr sok sf sr
    kok=$(csvcol "$dir/kam-uac/stat.csv" 'SuccessfulCall(C)'); kf=$(csvcol "$dir/kam-uac/stat.csv" 'FailedCall(C)'); kr=$(csvcol "$dir/kam-uac/stat.csv" 'Retransmissions(C)')
    sok=$(csvcol "$dir/sluice-uac/stat.csv" 'SuccessfulCall(C)'); sf=$(csvcol "$dir/sluice-uac/stat.csv" 'FailedCall(C)'); sr=$(csvcol "$dir/sluice-uac/stat.csv" 'Retransmissions(C)')
    awk -v kt=$((k1 - k0)) -v st=$((s1 - s0)) -v hz="$HZ" -v kok="${kok:-0}" -v kf="${kf:-?}" -v kr="${kr:-?}" \
        -v sok="${sok:-0}" -v sf="${sf:-?}" -v sr="${sr:-?}" \
        'BEGIN { ku = kok > 0 ? kt / hz * 1e6 / kok : 0; su = sok > 0 ? st / hz * 1e6 / sok : 0
                 printf "%.1f %d %s %s %.1f %d %s %s %.3f\n", ku, kok, kf, kr, su, sok, sf, sr, (su > 0 ? ku / su : 0) }'
}

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

report() {   # report NAME LINE
    set -- "$1" $2
    printf '%-5s %7s us/call  ok=%-6s failed=%-5s retrans=%-5s cpu=%s%%  child processes %s us/call\n' "$1" "$2" "$3" "$4" "$5" "$6" "${7:-?}"
}

profile_flags() {   # the flags of the last profiled run
    [ "${PROFILE:-0}" = 1 ] && echo "-cpuprofile $OUT/cpu.prof"
}

case $MODE in
    one)
        B=$(binary one "${BIN:-}")
        answerers
        log "one: RATE=$RATE calls/s x ${SECS}s, RUNS=$RUNS, sluice on CPU$LB_CPU${LB_QUOTA:+ capped at $LB_QUOTA%}, SIPp on CPU$GEN_CPU; out $OUT"
        : > "$OUT/one.txt"
        for i in $(seq "$RUNS"); do
            extra=""; [ "$i" = "$RUNS" ] && extra=$(profile_flags)
            if [ "$i" = "$RUNS" ] && [ "${PERF:-0}" = 1 ]; then PERF_NEXT=1; fi
            line=$(run "$i" one "$B" $extra); echo "$line" >> "$OUT/one.txt"; report one "$line"
        done
        echo "median: $(awk '{ print $1 }' "$OUT/one.txt" | median) us/call (sluice CPU / completed calls; failed: $(awk '{ s += $3 } END { print s }' "$OUT/one.txt"))"
        echo "of it: the store process $(awk '{ print $6 }' "$OUT/one.txt" | median) us/call (median)"
        ;;
    ab)
        [ -n "${BASE:-}" ] || die "ab needs BASE=path-or-revision (and NEW=path-or-revision, default this tree)"
        A=$(binary base "$BASE"); N=$(binary new "${NEW:-}")
        answerers
        log "ab: RATE=$RATE calls/s x ${SECS}s, RUNS=$RUNS each interleaved, sluice on CPU$LB_CPU${LB_QUOTA:+ capped at $LB_QUOTA%}; out $OUT"
        : > "$OUT/base.txt"; : > "$OUT/new.txt"
        for i in $(seq "$RUNS"); do
            line=$(run "$i" base "$A" ${BASE_EXTRA:-}); echo "$line" >> "$OUT/base.txt"; report base "$line"
            extra=""; [ "$i" = "$RUNS" ] && extra=$(profile_flags)
            if [ "$i" = "$RUNS" ] && [ "${PERF:-0}" = 1 ]; then PERF_NEXT=1; fi
            line=$(run "$i" new "$N" ${NEW_EXTRA:-} $extra); echo "$line" >> "$OUT/new.txt"; report new "$line"
        done
        mb=$(awk '{ print $1 }' "$OUT/base.txt" | median); mn=$(awk '{ print $1 }' "$OUT/new.txt" | median)
        echo "median base: $mb us/call, new: $mn us/call, new/base: $(awk -v a="$mb" -v b="$mn" 'BEGIN { printf "%.3f", (a > 0 ? b / a : 0) }')" \
            "(failed base $(awk '{ s += $3 } END { print s }' "$OUT/base.txt"), new $(awk '{ s += $3 } END { print s }' "$OUT/new.txt"))"
        ;;
    vs-kamailio)
        N=$(binary new "${NEW:-}")
        answerers
        log "vs-kamailio: RATE=$RATE calls/s x ${SECS}s, RUNS=$RUNS each interleaved, on CPU$LB_CPU${LB_QUOTA:+ capped at $LB_QUOTA%}; out $OUT"
        : > "$OUT/kamailio.txt"; : > "$OUT/new.txt"
        for i in $(seq "$RUNS"); do
            line=$(run "$i" kam kamailio); echo "$line" >> "$OUT/kamailio.txt"; report kam "$line"
            line=$(run "$i" new "$N" ${NEW_EXTRA:-}); echo "$line" >> "$OUT/new.txt"; report new "$line"
        done
        mk=$(awk '{ print $1 }' "$OUT/kamailio.txt" | median); mn=$(awk '{ print $1 }' "$OUT/new.txt" | median)
        echo "median kamailio: $mk us/call, sluice: $mn us/call, kamailio/sluice: $(awk -v a="$mn" -v b="$mk" 'BEGIN { printf "%.3f", (a > 0 ? b / a : 0) }')" \
            "(failed kamailio $(awk '{ s += $3 } END { print s }' "$OUT/kamailio.txt"), sluice $(awk '{ s += $3 } END { print s }' "$OUT/new.txt"))"
        echo "of sluice's: its store process $(awk '{ print $6 }' "$OUT/new.txt" | median) us/call (median)"
        ;;
    side-kamailio)
        N=$(binary new "${NEW:-}")
        KAM_PORT=$((PORT_BASE + 2)) KAM_UAC=$((PORT_BASE + 3))
        free_udp "$KAM_PORT"; free_udp "$KAM_UAC"
        LIFETIME=$((RUNS * 2 * (SECS + 30) + 60)) answerers
        B=; [ -n "${BASE:-}" ] && B=$(binary base "$BASE")
        log "side-kamailio: RATE=$RATE calls/s x ${SECS}s to each, RUNS=$RUNS${B:+ of BASE then NEW}, Kamailio stateless and sluice both on CPU$LB_CPU at once, SIPp on CPU$GEN_CPU; out $OUT"
        : > "$OUT/side.txt"; : > "$OUT/side-base.txt"; : > "$OUT/pairs.txt"
        sideline() {   # sideline NAME RUN LINE
            local name=$1 run=$2; shift 2
            printf '%-4s run %s  kamailio %7s us/call ok=%-6s failed=%-5s retrans=%-5s  sluice %7s us/call ok=%-6s failed=%-5s retrans=%-5s  kamailio/sluice %s\n' "$name" "$run" "$@"
        }
        for i in $(seq "$RUNS"); do
            if [ -n "$B" ]; then
                lb=$(side "$i-base" "$B" ${BASE_EXTRA:-}); echo "$lb" >> "$OUT/side-base.txt"; sideline base "$i" $lb
            fi
            line=$(side "$i" "$N" ${NEW_EXTRA:-}); echo "$line" >> "$OUT/side.txt"; sideline new "$i" $line
            # The pair's ratio of ratios: this tree's headline ratio over
            # BASE's, a few seconds apart (the machine's state moves the
            # ratio itself, see bench/README.md).
            if [ -n "$B" ]; then
                echo "$lb $line" | awk '$3 == 0 && $7 == 0 && $12 == 0 && $16 == 0 && $9 > 0 { printf "%.3f\n", $18 / $9 }' >> "$OUT/pairs.txt"
            fi
        done
        # A run with a failed call on either side is no figure of cost.
        clean=$(awk '$3 == 0 && $7 == 0' "$OUT/side.txt")
        if [ -z "$clean" ]; then
            echo "median kamailio/sluice: - (no run without a failed call)"
        else
            echo "median kamailio: $(echo "$clean" | awk '{ print $1 }' | median) us/call, sluice: $(echo "$clean" | awk '{ print $5 }' | median) us/call," \
                "kamailio/sluice: $(echo "$clean" | awk '{ print $9 }' | median) (median of $(echo "$clean" | wc -l) clean runs of $RUNS)"
        fi
        if [ -n "$B" ]; then
            cb=$(awk '$3 == 0 && $7 == 0 { print $9 }' "$OUT/side-base.txt" | median)
            echo "base: kamailio/sluice ${cb:--} (median of $(awk '$3 == 0 && $7 == 0' "$OUT/side-base.txt" | wc -l) clean runs)"
            if [ -s "$OUT/pairs.txt" ]; then
                echo "new ratio / base ratio: $(median < "$OUT/pairs.txt") (median of $(wc -l < "$OUT/pairs.txt") clean pairs: $(tr '\n' ' ' < "$OUT/pairs.txt"))"
            else
                echo "new ratio / base ratio: - (no pair without a failed call)"
            fi
        fi
        ;;
    curve)
        N=$(binary new "${NEW:-}")
        DIALOGFILL=$OUT/dialogfill SIPLOAD=$OUT/sipload
        go build -o "$DIALOGFILL" ./bench/dialogfill && go build -o "$SIPLOAD" ./bench/sipload || die "build of bench/dialogfill or bench/sipload failed"
        ulimit -n 20000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
        DIALOG_NS=${DIALOG_NS-0 100000 1000000}; CLIENT_NS=${CLIENT_NS-10 10000}
        # The answerers serve every point of every round: about a minute
        # a point at most (the million dialogs written first).
        LIFETIME=$((RUNS * (2 + $(echo $DIALOG_NS | wc -w) + 2 * $(echo $CLIENT_NS | wc -w)) * (SECS + 60) + 120)) answerers
        log "curve: RATE=$RATE calls/s x ${SECS}s (CPU from ${WARM:-4}s on), RUNS=$RUNS rounds, dialogs: $DIALOG_NS, TCP connections: $CLIENT_NS, on CPU$LB_CPU${LB_QUOTA:+ capped at $LB_QUOTA%}; out $OUT"
        printf 'round\tsystem\taxis\tsize\tus_per_call\tcalls\tfailed\tretrans\tcpu_pct\trss_kb\tstore_rss_kb\n' > "$OUT/curve.tsv"
        point() {   # point ROUND SYSTEM AXIS SIZE BIN DIALOGS CONNS
            local line
            line=$(crun "$1" "$2-$3-$4" "$5" "$6" "$7")
            printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$(echo "$line" | tr ' ' '\t')" >> "$OUT/curve.tsv"
            log "round $1 $2 $3=$4: $line"
        }
        for i in $(seq "$RUNS"); do
            for d in $DIALOG_NS; do point "$i" sluice dialogs "$d" "$N" "$d" 0; done
            [ "${KAMAILIO:-1}" = 1 ] && point "$i" kamailio transport 0 kamailio 0 0
            for c in $CLIENT_NS; do
                point "$i" sluice transport "$c" "$N" 0 "$c"
                [ "${KAMAILIO:-1}" = 1 ] && point "$i" kamailio transport "$c" kamailio 0 "$c"
            done
        done
        # The UDP point of the transport axis is sluice's dialogs=0 point.
        awk -F'\t' 'NR > 1 && $2 == "sluice" && $3 == "dialogs" && $4 == 0 { $3 = "transport"; print }' OFS='\t' "$OUT/curve.tsv" > "$OUT/udp.tmp"
        { cat "$OUT/curve.tsv"; cat "$OUT/udp.tmp"; } | awk -F'\t' '
            NR > 1 { k = $2 "\t" $3 "\t" $4; keys[k] = 1; f[k] += $7
                     if ($7 > 0 || $6 == 0) next   # a run with failed calls is no figure of cost
                     n[k]++; us[k, n[k]] = $5; rss[k, n[k]] = $10 + $11 }
            function med(a, k, m,   i, j, t, v) { for (i = 1; i <= m; i++) v[i] = a[k, i]; for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
                return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2 }
            END { print "system\taxis\tsize\tus_per_call\trss_kb\tfailed\truns"; for (k in keys) printf "%s\t%.1f\t%d\t%d\t%d\n", k, (n[k] ? med(us, k, n[k]) : 0), (n[k] ? med(rss, k, n[k]) : 0), f[k], n[k] }' \
            | { read -r h; echo "$h"; sort -t"$(printf '\t')" -k1,1 -k2,2 -k3,3n; } > "$OUT/curve-summary.tsv"
        rm -f "$OUT/udp.tmp"
        column -t -s"$(printf '\t')" "$OUT/curve-summary.tsv"
        ;;
    *) die "unknown mode $MODE (one, ab, vs-kamailio, side-kamailio, curve)" ;;
esac
log "logs in $OUT"
