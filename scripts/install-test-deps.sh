#!/usr/bin/env bash
# Installs what the tests need beyond Go, from Debian: sipp (package
# sip-tester) and wrk for the interop legs, chromium for the browser tests
# (the dashboard, and SIP over WebSocket from a browser), promtool (package
# prometheus) for the /metrics exposition check, redis-server for the
# cluster's end-to-end tests, kamailio with its TLS and WebSocket modules
# (a real registrar behind the SIP edge), stunnel4 (SIPp over TLS: Debian's
# SIPp has no TLS), nghttp2-client (h2load, nghttp: HTTP/2 clients),
# dnsmasq-base (a real DNS server for backends in DNS), rsyslog (a real
# syslog receiver for the access log), haproxy and nginx (a layer-4
# balancer sending the PROXY protocol in front of sluice, a backend reading
# it behind) and curl. Idempotent: installs only
# the packages that are missing. Needs root when something is missing.
set -euo pipefail
want=(sip-tester wrk chromium prometheus redis-server kamailio kamailio-tls-modules
  kamailio-websocket-modules stunnel4 nghttp2-client dnsmasq-base rsyslog haproxy nginx curl)
need=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -eq 0 ]; then
  echo "install-test-deps: all present (${want[*]})"
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
# Debian starts some of these as services when it installs them; the tests
# start their own on loopback and stop them by PID. Stop only the services
# of packages this run installed, never one that was there before.
for p in "${need[@]}"; do
  case $p in kamailio | stunnel4 | rsyslog | redis-server | haproxy | nginx) svc=$p ;; *) continue ;; esac
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    systemctl stop "$svc" 2>/dev/null || true
  elif command -v service >/dev/null 2>&1; then
    service "$svc" stop >/dev/null 2>&1 || true
  fi
done
