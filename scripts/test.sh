#!/usr/bin/env bash
# The test command: formatting, vet, every Go test under the race detector,
# then the sipp/wrk interop legs (their tools are installed on demand).
# Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

echo "== go vet"
go vet ./...

echo "== go test -race"
go test -race -count=1 -timeout 15m ./...

if [ "${SKIP_INTEROP:-0}" = 1 ]; then
  echo "== interop skipped (SKIP_INTEROP=1)"
  exit 0
fi
echo "== interop"
bash scripts/install-test-deps.sh
for leg in bench/sip.sh bench/http.sh; do
  if [ -f "$leg" ]; then
    echo "-- $leg ci"
    bash "$leg" ci
  fi
done
echo "== all tests passed"
