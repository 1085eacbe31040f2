#!/usr/bin/env bash
# Cost curves in process: how the cost of each piece of the request/call path grows with
# its size (issue #25 point 3, the part a shared machine can measure). Runs the
# BenchmarkCurve* functions next to the code, COUNT times each, and draws them.
#
# usage: bench/curves.sh            all families, charts into bench/img/
#        PKGS=./lb bench/curves.sh  only some packages
#
#   lb         BenchmarkCurvePick   one pick per policy, 2 / 50 / 500 backends in one pool
#              BenchmarkCurveRoute  route choice, 1 / 100 / 1,000 routes (regex: 1 / 10 / 64)
#   admission  BenchmarkCurveRules  Controller.Decide, 0 / 1 / 10 / 100 ARM rules
#   sip        BenchmarkCurveDialog dialog lookup and insert at 0 / 100k / 1M live dialogs,
#                                   and heap in use per live dialog (B/dialog)
#   http       BenchmarkCurveAdmitPick, BenchmarkCurveRoundTrip  routes and ARM rules
#
# Writes $OUT/bench.txt (go test output), $OUT/curves.tsv (median per point: family,
# series, n, cpu_ns_op, ns_op, B_op, allocs_op, runs, other metrics), $OUT/curves.md (the
# table of bench/RESULTS.md) and $IMG/curves-<family>.png (CPU ns per operation against
# size, log x). Each benchmark reports the process CPU time per operation (cpu-ns/op,
# getrusage) beside go test's wall-clock ns/op: on a shared machine the wall clock also
# counts the time other processes held the cores, the CPU time does not, so the charts
# draw CPU time. Bounded: each point runs BENCHTIME, the whole under TIMEOUT, at nice 10 so
# the rest of a shared machine goes first.
#
# Knobs: COUNT=5 BENCHTIME=200ms TIMEOUT=20m OUT=/tmp/sluice-bench/curves-DATE IMG=bench/img
set -eu
cd "$(dirname "$0")/.."
COUNT=${COUNT:-5}
BENCHTIME=${BENCHTIME:-200ms}
TIMEOUT=${TIMEOUT:-20m}
PKGS=${PKGS:-./lb ./admission ./sip ./http}
OUT=${OUT:-${TMPDIR:-/tmp}/sluice-bench/curves-$(date +%Y%m%d-%H%M%S)}
IMG=${IMG:-bench/img}
mkdir -p "$OUT"
{
	echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(go version)"
	echo "# nproc $(nproc) load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
} >"$OUT/bench.txt"
# shellcheck disable=SC2086 # PKGS is a list
nice -n 10 go test -run '^$' -bench '^BenchmarkCurve' -benchmem -benchtime "$BENCHTIME" \
	-count "$COUNT" -timeout "$TIMEOUT" $PKGS | tee -a "$OUT/bench.txt"
go run ./bench/plot curves -in "$OUT/bench.txt" -out "$IMG" -tsv "$OUT/curves.tsv" -md "$OUT/curves.md"
