#!/usr/bin/env bash
# Print the Debian archive this machine's apt sources use, so images are built from the same
# mirror the machine itself trusts and no host name is written into the repository.
#
#   bash images/apt-mirror.sh main       # e.g. the URI of the "bookworm" entry
#   bash images/apt-mirror.sh security   # the URI of the "<codename>-security" entry
#
# Reads deb822 files (/etc/apt/sources.list.d/*.sources) and one-line lists (sources.list,
# sources.list.d/*.list). An entry counts as Debian's when one of its suites is a Debian codename
# or alias (optionally with -updates, -backports or -security), which skips third-party
# repositories on the same machine. Exits 1, printing nothing, when no such entry exists.
set -euo pipefail
kind=${1:-main}
case "$kind" in main | security) ;; *) echo "usage: apt-mirror.sh main|security" >&2; exit 2 ;; esac
dir=${APT_SOURCES_DIR:-/etc/apt}

shopt -s nullglob
files=()
for f in "$dir"/sources.list.d/*.sources "$dir"/sources.list "$dir"/sources.list.d/*.list; do
    [ -r "$f" ] && files+=("$f")
done
[ ${#files[@]} -gt 0 ] || exit 1
awk -v kind="$kind" '
function debian_suite(s) {
    return s ~ /^(buster|bullseye|bookworm|trixie|forky|duke|sid|stable|testing|unstable|oldstable|oldoldstable)(-updates|-backports|-security|\/updates)?$/
}
function wanted(s) {
    if (!debian_suite(s)) return 0
    if (kind == "security") return s ~ /-security$|\/updates$/
    return s !~ /-security$|\/updates$|-updates$|-backports$/
}
function consider(uris, suites, types,    n, i, u) {
    if (types !~ /(^|[ \t])deb([ \t]|$)/) return
    n = split(suites, ss, /[ \t]+/)
    for (i = 1; i <= n; i++) if (wanted(ss[i])) {
        split(uris, u, /[ \t]+/)
        if (u[1] != "") { sub(/\/+$/, "", u[1]); print u[1]; found = 1; exit }
    }
}
function flush() { if (uris != "") consider(uris, suites, types); uris = suites = ""; types = "deb" }
BEGIN { types = "deb" }
FNR == 1 { flush() }
/^[ \t]*#/ { next }
FILENAME ~ /\.sources$/ {
    if ($0 ~ /^[ \t]*$/) { flush(); next }
    line = $0; key = tolower(line); sub(/:.*/, "", key); sub(/^[^:]*:[ \t]*/, "", line)
    if (key == "uris") uris = line; else if (key == "suites") suites = line; else if (key == "types") types = line
    next
}
$1 == "deb" {
    i = 2
    if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
    consider($i, $(i + 1), "deb")
}
END { if (!found) { flush(); if (!found) exit 1 } }
' "${files[@]}"
