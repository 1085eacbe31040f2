#!/usr/bin/env bash
# Overload without loss, measured: new work at 5x the learned capacity for
# 60 s while 1,000 sticky HTTP sessions and 1,000 SIP dialogs keep sending,
# all on 127.0.0.1.
#
# usage: bench/overload.sh [driver flags...]
#   e.g. bench/overload.sh -duration 60s -factor 5 -sessions 1000 -dialogs 1000
#   (go run ./bench/overload -help lists them; the defaults are the full run)
#
# It builds sluice and the driver (bench/overload) into OUT, then runs the
# driver, which starts two demo HTTP backends and two demo SIP UASes in its
# own process (real memory per session or dialog, reported on /metrics),
# starts `sluice run` in front of them as its child, and:
#   1. establishes the sessions and dialogs (new work, refusals waited out);
#   2. lets them run alone for one MOP window (-window, 30 s);
#   3. offers new work at 3x the backends' safe rate until /status shows
#      every backend's MOP learned (at most -learn-timeout), then one window
#      more;
#   4. offers 5x the learned rate for -duration: HTTP requests without a
#      cookie and SIP calls (INVITE, 200, ACK, BYE after -lifetime), while
#      each session requests every second and each dialog re-INVITEs every
#      two seconds;
#   5. stops the offer, ends every dialog and call with BYE, stops sluice
#      with SIGTERM.
# Every second it prints a row (backend memory, new work sent / admitted /
# refused, affinity sent / succeeded, MOP's allowed rates, sluice's RSS and
# goroutines), then a summary and a verdict. Exit 0: every property held;
# 1: one failed (listed); 2: the scenario could not be carried out.
# The driver's output is also kept in OUT/overload.txt; sluice's log and
# data in OUT/work.
#
# Knobs (env): OUT=$TMPDIR/sluice-bench/overload-<timestamp>
# Every process is started here or by the driver and stopped by its PID;
# the run is bounded by `timeout` (20 min).
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-${TMPDIR:-/tmp}/sluice-bench/overload-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/work" || exit 2
OUT=$(cd "$OUT" && pwd -P)

log() { echo "[$(date +%T)] $*" >&2; }

log "building sluice and the driver into $OUT"
go build -o "$OUT/sluice" ./cmd/sluice || { log "ERROR: sluice build failed"; exit 2; }
go build -o "$OUT/overload" ./bench/overload || { log "ERROR: driver build failed"; exit 2; }

log "running: overload -sluice $OUT/sluice -dir $OUT/work $*"
timeout --signal=TERM --kill-after=30s 20m "$OUT/overload" -sluice "$OUT/sluice" -dir "$OUT/work" "$@" | tee "$OUT/overload.txt"
rc=${PIPESTATUS[0]}
log "driver exited $rc; output in $OUT/overload.txt, sluice log in $OUT/work/sluice.log"
exit "$rc"
