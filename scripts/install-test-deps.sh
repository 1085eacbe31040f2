#!/usr/bin/env bash
# Installs what the tests need beyond Go: sipp (Debian package
# sip-tester) and wrk for the interop legs, chromium for the dashboard's
# browser test (admin/browser_test.go), promtool (Debian package
# prometheus) for the /metrics exposition check, redis-server for the
# cluster's end-to-end tests (cluster/e2e_test.go). Idempotent: installs
# only what is missing. Needs root.
set -euo pipefail
need=()
command -v sipp >/dev/null 2>&1 || need+=(sip-tester)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if [ ${#need[@]} -eq 0 ]; then
  echo "install-test-deps: sipp, wrk, chromium, promtool and redis-server present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-test-deps: need root to install ${need[*]} (apt-get)" >&2
  exit 1
fi
echo "install-test-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"
