#!/usr/bin/env bash
# Build the web console into sandboxes/server/console/static/, where the service serves it
# (/console, when `console = true`). Its packages come from the npm registry npm is configured
# for (no host name written here), pinned by package-lock.json; node and npm are installed with
# apt when missing (CI is root on a fresh Debian). Skipped when the build is newer than every
# source file.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$here/../sandboxes/server/console/static

if [ -f "$out/index.html" ] && [ -z "$(find "$here/src" "$here/index.html" "$here/package-lock.json" "$here/vite.config.ts" -newer "$out/index.html" -print -quit)" ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    [ "$(id -u)" -eq 0 ] || { echo "console/build.sh: npm is missing: apt-get install -y nodejs npm" >&2; exit 1; }
    apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >&2
fi
cd "$here"
npm ci --no-audit --no-fund --loglevel=error >&2
npm run --silent build >&2
