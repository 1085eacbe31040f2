#!/usr/bin/env bash
# Refreshes the JsSIP bundle the browser test of SIP over WebSocket loads in
# headless Chromium (sip/testdata/jssip/): JsSIP from the npm registry,
# bundled with esbuild into one IIFE script that sets window.JsSIP (the npm
# package ships CommonJS only). Needs node/npm (apt-get install nodejs npm);
# the tests themselves need neither: the bundle is checked in.
# Usage: scripts/vendor-jssip.sh [VERSION] (default: 3.13.8).
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-3.13.8}"
command -v npm >/dev/null 2>&1 || { echo "vendor-jssip: npm not found (apt-get install nodejs npm)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm install --silent --no-audit --no-fund "jssip@${version}" esbuild@0.24 >/dev/null)
echo 'import JsSIP from "jssip"; window.JsSIP = JsSIP;' > "$tmp/entry.js"
(cd "$tmp" && node_modules/.bin/esbuild entry.js --bundle --minify --format=iife --log-level=warning \
  --outfile=jssip.iife.min.js)
got="$(sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$tmp/node_modules/jssip/package.json" | head -n1)"
dest=sip/testdata/jssip
mkdir -p "$dest"
cp "$tmp/jssip.iife.min.js" "$dest/jssip.iife.min.js"
cp "$tmp/node_modules/jssip/LICENSE.md" "$dest/LICENSE.md"
echo "$got" > "$dest/VERSION"
echo "vendor-jssip: JsSIP ${got} in ${dest}"
