#!/usr/bin/env bash
# The MCP Inspector (npm @modelcontextprotocol/inspector) for tests/mcp/: installed when missing,
# prints the path of its `mcp-inspector` command.
#   "$(bash .ci/mcp-inspector.sh)" --cli sandboxes mcp --method tools/list
#
# Installed with `npm install` from whatever registry npm is configured for (no host name is
# written here) into $MCP_INSPECTOR_CACHE (default ~/.cache/sandboxes/mcp-inspector, outside the
# repository), one directory per package spec, built beside it and renamed into place, so an
# interrupted install leaves nothing that looks complete. npm (with node) is installed with apt
# when missing (CI is root on a fresh Debian).
#
# Environment:
#   MCP_INSPECTOR_CACHE    cache directory (default ${XDG_CACHE_HOME:-~/.cache}/sandboxes/mcp-inspector)
#   MCP_INSPECTOR_PACKAGE  npm package spec (default @modelcontextprotocol/inspector@0.15.0: the
#                          newest its Debian node (20) runs; 2.x needs node 22.19)
set -euo pipefail

package=${MCP_INSPECTOR_PACKAGE:-@modelcontextprotocol/inspector@0.15.0}
cache=${MCP_INSPECTOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandboxes/mcp-inspector}
dir=$cache/$(printf '%s' "$package" | tr -c 'A-Za-z0-9._-' '_')
bin=$dir/node_modules/.bin/mcp-inspector

log() { printf 'mcp-inspector.sh: %s\n' "$*" >&2; }
die() { printf 'mcp-inspector.sh: ERROR: %s\n' "$*" >&2; exit 1; }

usable() { [ -x "$bin" ] && "$bin" --help >/dev/null 2>&1; }

if usable; then
    printf '%s\n' "$bin"
    exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
    [ "$(id -u)" -eq 0 ] || die "missing npm: install it (apt-get install -y npm)"
    log "installing npm"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q npm; } >&2 \
        || die "could not install npm with apt"
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/.install.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "installing $package with npm"
npm install --prefix "$work" --silent --no-audit --no-fund "$package" >&2 || die "npm install $package failed"
[ -x "$work/node_modules/.bin/mcp-inspector" ] || die "$package has no mcp-inspector command"

# Another run may have finished first: keep its copy, which is just as complete.
mv -T "$work" "$dir" 2>/dev/null || usable || die "could not install into $dir"
trap - EXIT
printf '%s\n' "$bin"
