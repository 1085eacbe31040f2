#!/usr/bin/env bash
# The test command: formatting, vet, every Go test under the race detector
# (the wrk interop test among them; the HTTP suite runs each test on both
# connection engines, as subtests; SLUICE_TEST_HTTP_ENGINE=loop or fasthttp
# keeps one), then the sipp interop leg. sipp and wrk are installed first
# when missing (root, Debian packages).
# Exits non-zero on the first failure. SKIP_INTEROP=1: Go tests only, and
# the tests that need sipp, wrk, redis-server, promtool or chromium skip
# themselves when those are missing -- except with CI set, where a missing
# tool fails its test and SKIP_INTEROP is refused (internal/testenv).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${CI:-}" ] && [ "${SKIP_INTEROP:-0}" = 1 ]; then
  echo "test.sh: SKIP_INTEROP=1 is refused when CI is set: CI runs every real-component test" >&2
  exit 2
fi

if [ "${SKIP_INTEROP:-0}" != 1 ]; then
  echo "== tools"
  bash scripts/install-test-deps.sh
fi

# Tests build without profile-guided optimisation: cmd/sluice/default.pgo
# changes code layout, not behaviour, and a PGO build of every package
# (race and plain, for the tests that build the binary) would add minutes.
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-pgo=off"

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

echo "== go vet"
go vet ./...

echo "== go test -race"
# The overload scenario judges backend memory against MOP's ceiling: it
# runs alone afterwards, not beside the other packages' load tests, which
# would take the CPU its backends and sluice need.
go test -race -count=1 -timeout 15m $(go list ./... | grep -v '/bench/overload$')
echo "== go test -race ./bench/overload (alone)"
go test -race -count=1 -timeout 5m ./bench/overload

if [ "${SKIP_INTEROP:-0}" = 1 ]; then
  echo "== sipp interop skipped (SKIP_INTEROP=1)"
  exit 0
fi
echo "== sipp interop"
bash bench/sip.sh ci
echo "== all tests passed"
