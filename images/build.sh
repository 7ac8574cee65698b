#!/usr/bin/env bash
# Build the sandboxes images: sandboxes/runtime, sandboxes/ssh-vm, sandboxes/service and
# sandboxes/code-interpreter, tagged <VERSION> and latest.
#
#   images/build.sh                              # offline: base debootstrapped from the apt mirror
#   BASE=debian:bookworm-slim images/build.sh    # online: base pulled from a registry
#   images/build.sh service                      # only these images (runtime must exist for the others)
#
# Environment:
#   BASE             "local" (default) or an image reference to build on
#   SANDBOXES_CACHE  cache dir for the debootstrapped rootfs (default ~/.cache/sandboxes)
#   DEBIAN_MIRROR    apt mirror for debootstrap and the base image (default: the Debian archive
#                    this machine's own apt sources name, so a machine behind its own mirror works)
#   DEBIAN_SECURITY_MIRROR  (default: the security archive of this machine's apt sources, else
#                    DEBIAN_MIRROR with its last component suffixed -security)
#   BUILD_NETWORK    passed as `docker build --network`, e.g. "host" if build containers have no network
#   BUILD_CA_BUNDLE  CA bundle pip trusts while building the service image (default: $PIP_CERT,
#                    $SSL_CERT_FILE, or this machine's /etc/ssl/certs/ca-certificates.crt)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(runtime ssh-vm service code-interpreter)
for target in "${targets[@]}"; do
    case "$target" in runtime | ssh-vm | service | code-interpreter) ;; *) echo "build.sh: unknown image $target" >&2; exit 2 ;; esac
done
wanted() { [[ " ${targets[*]} " == *" $1 "* ]]; }
version=$(tr -d '[:space:]' <"$here/VERSION")
BASE=${BASE:-local}
cache=${SANDBOXES_CACHE:-$HOME/.cache/sandboxes}
rootfs=$cache/rootfs-bookworm
marker=$rootfs.done          # beside the rootfs, not in it, so it is not part of the image
base_image=sandboxes/base:bookworm

log() { printf '==> [%3ds] %s\n' "$SECONDS" "$*" >&2; }
die() { printf 'build.sh: ERROR: %s\n' "$*" >&2; exit 1; }

# The apt mirrors come from this machine's own sources (see apt-mirror.sh), so no host name is
# written in the repository.
mirror=${DEBIAN_MIRROR:-$(bash "$here/apt-mirror.sh" main)} \
    || die "no Debian archive in this machine's apt sources: set DEBIAN_MIRROR"
security_mirror=${DEBIAN_SECURITY_MIRROR:-$(bash "$here/apt-mirror.sh" security 2>/dev/null || echo "$mirror-security")}

docker info >/dev/null 2>&1 || die "Docker engine not reachable (start one: bash .ci/docker.sh)"

# A minbase bookworm rootfs, trimmed like debian:*-slim. Only a rootfs with a marker counts as
# complete: an interrupted debootstrap is thrown away and redone.
make_rootfs() {
    [ "$(id -u)" -eq 0 ] || die "debootstrap needs root"
    if ! command -v debootstrap >/dev/null; then
        log "installing debootstrap"
        apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2 \
            || die "debootstrap missing and could not be installed (apt-get install -y debootstrap)"
    fi
    log "debootstrap --variant=minbase bookworm $rootfs (mirror $mirror)"
    # --one-file-system: an interrupted debootstrap may leave proc/sys mounted inside.
    rm -rf --one-file-system "$rootfs" "$rootfs.tmp" "$marker"
    mkdir -p "$cache"
    debootstrap --variant=minbase bookworm "$rootfs.tmp" "$mirror"

    # Same apt sources as the official image (main + updates + security), on our mirror.
    rm -f "$rootfs.tmp/etc/apt/sources.list"
    cat >"$rootfs.tmp/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security_mirror
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    # Slim: no docs, man pages or translations, now or for packages installed later.
    cat >"$rootfs.tmp/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
    find "$rootfs.tmp/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    rm -rf "$rootfs.tmp"/usr/share/{man,info}/* "$rootfs.tmp"/var/cache/apt/* "$rootfs.tmp"/var/lib/apt/lists/*
    find "$rootfs.tmp/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
    rm -f "$rootfs.tmp"/var/log/*.log "$rootfs.tmp"/var/log/apt/*

    mv "$rootfs.tmp" "$rootfs"
    date -u +%Y%m%dT%H%M%SZ >"$marker"
}

if wanted runtime && [ "$BASE" = local ]; then
    if [ -s "$marker" ] && [ -d "$rootfs" ]; then
        log "reusing rootfs $rootfs ($(cat "$marker"))"
    else
        make_rootfs
    fi
    # Re-importing would give a new image ID and invalidate every cached layer built on it, so
    # import only when the image is missing or came from another rootfs.
    rootfs_id=$(cat "$marker")
    if [ "$(docker image inspect -f '{{index .Config.Labels "io.sandboxes.rootfs"}}' "$base_image" 2>/dev/null)" = "$rootfs_id" ]; then
        log "reusing $base_image (rootfs $rootfs_id)"
    else
        log "docker import $rootfs -> $base_image"
        tar --numeric-owner -C "$rootfs" -c . | docker import \
            --change "LABEL io.sandboxes.rootfs=$rootfs_id" \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'CMD ["bash"]' \
            - "$base_image" >/dev/null
    fi
    BASE=$base_image
fi

# --force-rm: a failed step leaves no stopped container behind.
build_args=(--force-rm --build-arg "VERSION=$version")
[ -z "${BUILD_NETWORK:-}" ] || build_args+=(--network "$BUILD_NETWORK")

if wanted runtime; then
    log "docker build sandboxes/runtime:$version (base $BASE)"
    docker build "${build_args[@]}" --build-arg "BASE=$BASE" \
        -t "sandboxes/runtime:$version" -t sandboxes/runtime:latest "$here/runtime"
fi
docker image inspect "sandboxes/runtime:$version" >/dev/null 2>&1 \
    || die "sandboxes/runtime:$version is missing: build it first (images/build.sh runtime)"

if wanted ssh-vm; then
    log "docker build sandboxes/ssh-vm:$version"
    docker build "${build_args[@]}" --build-arg "RUNTIME=sandboxes/runtime:$version" \
        -t "sandboxes/ssh-vm:$version" -t sandboxes/ssh-vm:latest "$here/ssh-vm"
fi

# The service image's context is the repository, sent as a tar of only what the image needs:
# no .venv, caches or .git. Fixed metadata (mtime, owner, order) keeps an unchanged tree a
# layer-cache hit. Its dependencies come from PyPI during the build (cached in a layer that
# only a change to pyproject.toml invalidates), over HTTPS checked against this machine's CA
# bundle (a TLS-inspecting proxy's CA is in it, not in the image's); the bundle is used in the
# build stage only and does not reach the image.
extra=$(mktemp -d)
trap 'rm -rf "$extra"' EXIT
ca=${BUILD_CA_BUNDLE:-${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
if [ -s "$ca" ]; then cp "$ca" "$extra/build-ca.pem"; else : >"$extra/build-ca.pem"; fi

if wanted service; then
    log "docker build sandboxes/service:$version"
    bash "$repo/console/build.sh"  # the web console the service serves, in the package it copies
    tar -c --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
        --exclude=__pycache__ --exclude='*.pyc' \
        -C "$repo" pyproject.toml README.md sandboxes images/service -C "$extra" build-ca.pem |
        docker build "${build_args[@]}" --build-arg "RUNTIME=sandboxes/runtime:$version" \
            -f images/service/Dockerfile -t "sandboxes/service:$version" -t sandboxes/service:latest -
fi

# The code interpreter's kernels and libraries come from PyPI during the build, into a layer that
# only a change to its requirements invalidates; the same CA bundle rule as the service's.
if wanted code-interpreter; then
    log "docker build sandboxes/code-interpreter:$version"
    tar -c --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
        -C "$repo" images/code-interpreter -C "$extra" build-ca.pem |
        docker build "${build_args[@]}" --build-arg "RUNTIME=sandboxes/runtime:$version" \
            -f images/code-interpreter/Dockerfile \
            -t "sandboxes/code-interpreter:$version" -t sandboxes/code-interpreter:latest -
fi

docker image ls --filter reference='sandboxes/*' >&2
