#!/usr/bin/env bash
# Installs the tools of the side-by-side benchmarks (bench/http.sh,
# bench/sip.sh, bench/https.sh and ../shared/peers/run.sh) from Debian: sipp
# (package sip-tester), wrk, h2load (nghttp2-client), haproxy, nginx and
# kamailio. Idempotent: packages whose
# command is already present are skipped. Needs root.
set -euo pipefail
declare -A cmd=([sip-tester]=sipp [wrk]=wrk [nghttp2-client]=h2load [haproxy]=haproxy [nginx]=nginx [kamailio]=kamailio)
need=()
for pkg in sip-tester wrk nghttp2-client haproxy nginx kamailio; do
  command -v "${cmd[$pkg]}" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -eq 0 ]; then
  echo "install-bench-deps: sipp wrk h2load haproxy nginx kamailio present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-bench-deps: need root to install ${need[*]} (apt-get)" >&2
  exit 1
fi
echo "install-bench-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
# The packaged services must not start and take ports 80/5060 (see
# ../shared/peers/RESULTS.md, pitfall 10).
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made_policy=1
fi
trap '[ "$made_policy" = 1 ] && rm -f "$policy"' EXIT
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"
