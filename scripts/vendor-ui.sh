#!/usr/bin/env bash
# Refreshes the chart library the admin dashboard embeds: uPlot from the npm
# registry (npm pack; needs node/npm: apt-get install nodejs npm). It writes
# uPlot.iife.min.js, uPlot.min.css and LICENSE to
# admin/ui/vendor/uplot-VERSION/, removes other versions, and points the page
# at the new one. Usage: scripts/vendor-ui.sh [VERSION] (default: latest).
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-latest}"
command -v npm >/dev/null 2>&1 || { echo "vendor-ui: npm not found (apt-get install nodejs npm)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "uplot@${version}" >/dev/null)
tar -xzf "$tmp"/uplot-*.tgz -C "$tmp"
got="$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$tmp/package/package.json" | head -n1)"
[ -n "$got" ] || { echo "vendor-ui: no version in the uplot package" >&2; exit 1; }
dest="admin/ui/vendor/uplot-${got}"
for f in dist/uPlot.iife.min.js dist/uPlot.min.css LICENSE; do
  [ -s "$tmp/package/$f" ] || { echo "vendor-ui: $f missing from uplot ${got}" >&2; exit 1; }
done
find admin/ui/vendor -mindepth 1 -maxdepth 1 -type d -name 'uplot-*' ! -name "uplot-${got}" -exec rm -rf {} +
mkdir -p "$dest"
cp "$tmp/package/dist/uPlot.iife.min.js" "$tmp/package/dist/uPlot.min.css" "$tmp/package/LICENSE" "$dest/"
# The page names the version in its <script> and <link> tags.
sed -i -E "s#vendor/uplot-[0-9A-Za-z.+-]+/#vendor/uplot-${got}/#g" admin/ui/index.html
echo "vendor-ui: uPlot ${got} in ${dest}"
