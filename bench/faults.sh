#!/usr/bin/env bash
# Fault scenarios of sluice, on loopback (127.0.0.1) only.
#
# usage: bench/faults.sh [ci|soak|all]      (default: ci)
#   ci    the fault tests that run in CI, verbose, with their figures:
#         lb (black hole probe, passive ejection charged at the failure's
#         end, Retry-After), sip (backend killed mid-call), http (hung,
#         resetting, garbage and 503 backends), cmd/sluice (SIGTERM in
#         every hard state, SIGINT after SIGTERM, kill -9 under load and
#         restart), persist (storage faults) and http smuggling.
#   soak  the process-level scenarios again and again: kill -9 under HTTP
#         and SIP load then restart (ROUNDS times, default 20) and SIGTERM
#         in every hard state (ROUNDS/4 times); prints, per round, the
#         requests lost at the kill and after the restart, and the exit
#         times, then the totals. Fails if any request sent after a
#         restart was lost or any exit broke its bound.
#   all   ci, then soak.
# Knobs (env): ROUNDS=20 OUT=$TMPDIR/sluice-bench/faults-<timestamp>
# Every test bounds its own loops and processes (see the test files); the
# whole script is bounded by `timeout` per step.
set -u
cd "$(dirname "$0")/.." || exit 1
MODE=${1:-ci}
ROUNDS=${ROUNDS:-20}
OUT=${OUT:-${TMPDIR:-/tmp}/sluice-bench/faults-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"

log() { echo "[$(date +%T)] $*" >&2; }
fail=0

# step NAME TIMEOUT go test args...: runs one go test, keeps its output.
step() {
    local name=$1 limit=$2
    shift 2
    log "$name: go test $*"
    if ! timeout "$limit" go test "$@" >"$OUT/$name.log" 2>&1; then
        log "$name: FAILED (see $OUT/$name.log)"
        fail=1
    fi
    grep -E '^(--- |ok |FAIL|PASS)|(fault|fault_restart|smuggle|run_persist)_test.go:[0-9]+:' "$OUT/$name.log" | grep -v '^=== ' || true
}

ci() {
    step lb 300s -race -count=1 -v -run 'TestFault|TestSlowBackendNotDownByProbes|TestPoolPanicSpreadsNewWork|TestDeadBackendOutAsBefore|TestNewBackendUnknown' ./lb
    step sip 300s -race -count=1 -v -run 'TestFault|TestFailover503|TestInDialogNotRefusedByProbes|TestIgnoredRequestsDoNotTakeOutLiveBackend|TestReloadedBackendUnknownUntilProbed|TestUnknownDialog|TestKnownDialogPassesSpentRule' ./sip
    step http 300s -race -count=1 -v -run 'TestFault|TestSmuggling|TestClientErrorsDoNotEject|TestSlowBackendsServedWhileProbesFail' ./http
    step persist 300s -race -count=1 -v -run 'TestInjectedWriteFailure|TestCloseReturnsByDeadline|TestDataDirRemoved|TestTmpfsFull' ./persist
    step process 600s -count=1 -v -run 'TestFault|TestRunSIGTERMWithBrokenDataDir|TestRunSecondSignal|TestKill9KeepsLearnedRate' ./cmd/sluice
}

soak() {
    local sig=$(( ROUNDS / 4 ))
    [ "$sig" -ge 1 ] || sig=1
    step kill9-soak $(( ROUNDS * 30 + 120 ))s -count="$ROUNDS" -v -run 'TestFaultKill9UnderLoad' ./cmd/sluice
    step sigterm-soak $(( sig * 60 + 120 ))s -count="$sig" -v -run 'TestFaultSIGTERMAlwaysStops|TestFaultSIGINTAfterSIGTERM' ./cmd/sluice
    echo
    echo "== kill -9 under load, $ROUNDS rounds ($OUT/kill9-soak.log)"
    awk '/fault_restart_test.go:[0-9]+: (HTTP|SIP):/ {
            p = $2; sub(":", "", p)
            for (i = 1; i <= NF; i++) {
                if ($(i+1) == "sent" && $(i+2) == "before") sent[p] += $i
                if ($(i+1) == "of" && $(i+3) == "lost") lost[p] += $i
                if ($(i+1) == "sent" && $(i+2) == "after") after[p] += $i
                if ($i == "restart," && $(i+2) == "lost") alost[p] += $(i+1)
                if ($(i+1) == "sent" && $(i+2) == "in") gap[p] += $i
            }
            n[p]++
        }
        END {
            for (p in n) printf "%-5s rounds %d: sent before the kill %d, lost at the kill %d; sent in the gap %d; sent after the restart %d, lost %d\n", p, n[p], sent[p], lost[p], gap[p], after[p], alost[p]
        }' "$OUT/kill9-soak.log"
    echo "== exit times after the signal, by state ($OUT/sigterm-soak.log; limit -drain-timeout 2s + 5s, a second signal: at once)"
    awk '/^=== (RUN|CONT)/ { name = $3 }
        / exited [0-9.]+(ms|s) after SIG/ {
            for (i = 1; i <= NF; i++) if ($i == "exited") v = $(i+1)
            ms = (v ~ /ms$/) ? v + 0 : (v ~ /µs$/) ? v / 1000 : v * 1000
            n[name]++; sum[name] += ms
            if (!(name in lo) || ms < lo[name]) lo[name] = ms
            if (ms > hi[name]) hi[name] = ms
        }
        END { for (k in n) printf "%-55s runs %2d  min %6.0f ms  mean %6.0f ms  max %6.0f ms\n", k, n[k], lo[k], sum[k] / n[k], hi[k] }' "$OUT/sigterm-soak.log" | sort
}

case $MODE in
ci) ci ;;
soak) soak ;;
all) ci; soak ;;
*) echo "usage: $0 [ci|soak|all]" >&2; exit 2 ;;
esac
[ "$fail" = 0 ] && log "all fault scenarios passed; logs in $OUT" || log "some fault scenario FAILED; logs in $OUT"
exit "$fail"
