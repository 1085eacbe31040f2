#!/usr/bin/env bash
# Cluster benchmark: a real redis-server on a loopback port and three nodes
# sharing one ARM rule, on loopback (127.0.0.1) only.
#
# usage: bench/cluster.sh
#
# Runs the cluster package's end-to-end tests (each starts redis-server on a
# free loopback port and three node processes, stops them by PID) and its
# cost benchmarks, then prints one table: the limit held evenly and
# unevenly, each node's share while Redis was killed, the rate after Redis
# was restarted and after a node was killed with SIGKILL; the decision path
# with and without the cluster; Redis round trips per node at 300, 3,000
# and 30,000 admitted/s and the p99 latency the cluster adds.
#
# Needs redis-server (scripts/install-test-deps.sh installs it). Takes about
# a minute. OUT=$TMPDIR/sluice-bench/cluster-<timestamp> keeps the raw logs.
set -u
cd "$(dirname "$0")/.." || exit 1
if ! command -v redis-server >/dev/null 2>&1; then
  echo "bench/cluster.sh: redis-server not found; run scripts/install-test-deps.sh" >&2
  exit 1
fi
OUT=${OUT:-${TMPDIR:-/tmp}/sluice-bench/cluster-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
echo "bench/cluster.sh: logs in $OUT"
timeout 180 go test -count=1 -run 'TestE2E' -v ./cluster >"$OUT/e2e.log" 2>&1
e2e=$?
timeout 120 go test -count=1 -run '^$' -bench 'Decide' -benchmem ./cluster >"$OUT/decide.log" 2>&1
timeout 120 go test -count=1 -run '^$' -bench 'ClusterCost' -benchtime 1x ./cluster >"$OUT/cost.log" 2>&1

echo
echo "== limit 300/s, three nodes, redis-server on loopback =="
grep -E 'e2e_test.go:[0-9]+: (even|uneven|node|after)' "$OUT/e2e.log" | sed -E 's/^ *e2e_test.go:[0-9]+: /  /'
grep -E '^(---|ok|FAIL)' "$OUT/e2e.log" | grep -v '^    ' | sed 's/^/  /'
echo
echo "== decision path (one ARM rule, limit never reached) =="
awk '/^Benchmark/ {printf "  %-28s %10s ns/op %6s allocs/op", $1, $3, $(NF-1); if ($5 ~ /roundtrips/ || $6 ~ /roundtrips/) printf "   %s round trips/op", $5; print ""}' "$OUT/decide.log"
echo
echo "== cost: three nodes, demand 90% of the limit =="
printf "  %-10s %12s %18s %20s %16s\n" limit admitted/s "round trips/s/node" "admitted/round trip" "p99 added (µs)"
awk '/^BenchmarkClusterCost/ {
  split($1, a, "="); sub(/-[0-9]+$/, "", a[2])
  for (i = 3; i < NF; i++) m[$(i+1)] = $i
  printf "  %-10s %12.0f %18.1f %20.1f %16.1f\n", a[2], m["admitted/s"], m["roundtrips/s/node"], m["admitted/roundtrip"], m["p99-added-µs"]
}' "$OUT/cost.log"
exit $e2e
