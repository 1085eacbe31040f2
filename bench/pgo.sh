#!/usr/bin/env bash
# The profile of a representative load for profile-guided optimisation:
# cmd/sluice/default.pgo, which `go build ./cmd/sluice` (and `go run`,
# `go install`) apply by default (-pgo=auto).
#
# usage: bench/pgo.sh               write cmd/sluice/default.pgo
#        OUT=DIR bench/pgo.sh       keep the pieces in DIR
#
# The load: HTTP keep-alive, plain and over TLS, at 50 and 200 connections
# (bench/https.sh with sluice alone, -cpuprofile), then SIP record-route
# calls at 2,000/s (bench/sip-cpu.sh PROFILE=1); the two CPU profiles are
# merged with `go tool pprof -proto`. Both scripts pin and cap as they
# always do, run on loopback only, and stop what they start by PID. About
# 3 minutes. Redo it when a hot path changes shape (a profile that names
# functions that are gone is ignored for them, not an error), and check
# the gain with bench/perf.sh or an interleaved A/B of the two builds:
#
#   go build -pgo=off -o /tmp/sluice-nopgo ./cmd/sluice
#   go build -o /tmp/sluice-pgo ./cmd/sluice
#   BASE=/tmp/sluice-nopgo NEW=/tmp/sluice-pgo RUNS=5 bench/sip-cpu.sh ab
#   A_BIN=/tmp/sluice-nopgo B_BIN=/tmp/sluice-pgo bench/http-ab.sh
set -eu
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-${TMPDIR:-/tmp}/sluice-bench/pgo-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd -P)
log() { echo "[$(date +%T)] $*" >&2; }

# The profiled binary is built without a profile, so the new profile does
# not describe code laid out by the old one.
log "building without PGO into $OUT/sluice"
go build -pgo=off -o "$OUT/sluice" ./cmd/sluice

log "HTTP load (bench/https.sh, sluice alone, modes ka and plain, c50 and c200)"
SLUICE_BIN=$OUT/sluice SLUICE_FLAGS="-cpuprofile $OUT/http.prof" SYSTEMS=sluice MODES=ka \
    CONNS="50 200" ROUNDS=1 DURATION=10 QUIET_MAX=10 OUT=$OUT/https bench/https.sh > "$OUT/https.log" 2>&1 ||
    { log "bench/https.sh failed: $OUT/https.log"; exit 1; }
log "SIP load (bench/sip-cpu.sh, 2,000 calls/s, 15 s)"
BIN=$OUT/sluice PROFILE=1 RUNS=1 SECS=15 OUT=$OUT/sip bench/sip-cpu.sh one > "$OUT/sip.log" 2>&1 ||
    { log "bench/sip-cpu.sh failed: $OUT/sip.log"; exit 1; }
for f in "$OUT/http.prof" "$OUT/sip/cpu.prof"; do
    [ -s "$f" ] || { log "no profile in $f"; exit 1; }
done
go tool pprof -proto "$OUT/http.prof" "$OUT/sip/cpu.prof" > "$OUT/merged.pgo"
cp "$OUT/merged.pgo" cmd/sluice/default.pgo
log "wrote cmd/sluice/default.pgo ($(wc -c < cmd/sluice/default.pgo) bytes); pieces in $OUT"
