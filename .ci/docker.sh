#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine; idempotent.
#   bash .ci/docker.sh      (or source it: it then neither exits your shell nor changes its options)
#
# CI runs inside a container without systemd, so `systemctl start docker` is not an option:
# dockerd is started directly in the background, logging to $DOCKERD_LOG.
#
# dockerd flags: none are needed on the CI machine (Debian bookworm, ext4 root, cgroup v1,
# iptables-nft usable as root). The defaults pick overlay2 and set up the docker0 bridge + NAT,
# which `docker build` needs to reach the apt mirror. Where that is not true, pass extra flags via
# $DOCKERD_FLAGS, e.g. "--storage-driver=vfs" when the root is itself overlayfs and overlay2
# cannot nest (dockerd usually falls back on its own), or "--iptables=false --bridge=none" when
# the container lacks CAP_NET_ADMIN (containers then have no network; build with --network host).

_sandboxes_ensure_docker() {
    local log=${DOCKERD_LOG:-/tmp/dockerd.log} sudo="" pid="" i

    # Not root (e.g. a CI user with sudo): run the privileged steps through sudo.
    [ "$(id -u)" -eq 0 ] || sudo=sudo

    if ! command -v docker >/dev/null 2>&1 || ! command -v dockerd >/dev/null 2>&1; then
        echo "docker.sh: installing docker.io" >&2
        $sudo apt-get update -q || return 1
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q docker.io || return 1
    fi

    if docker info >/dev/null 2>&1; then
        echo "docker.sh: engine already running" >&2
        return 0
    fi

    # A dockerd that is still starting up only needs waiting for; a second one would fail on
    # its pid file anyway.
    if pgrep -x dockerd >/dev/null 2>&1; then
        echo "docker.sh: dockerd is running but not answering yet; waiting" >&2
    else
        echo "docker.sh: starting dockerd ${DOCKERD_FLAGS:-} (log: $log)" >&2
        # shellcheck disable=SC2086  # DOCKERD_FLAGS is a list of words on purpose
        pid=$($sudo sh -c "nohup dockerd ${DOCKERD_FLAGS:-} >>'$log' 2>&1 & echo \$!") || return 1
    fi

    for i in $(seq 60); do
        if docker info >/dev/null 2>&1; then
            echo "docker.sh: engine up after ${i}s" >&2
            return 0
        fi
        # A dockerd that exited (bad flag, missing kernel feature) will not come up: stop waiting.
        if [ -n "$pid" ] && [ ! -d "/proc/$pid" ]; then
            break
        fi
        sleep 1
    done

    echo "docker.sh: ERROR: Docker engine did not come up (waited ${i}s); last lines of $log:" >&2
    $sudo tail -n 40 "$log" >&2 || true
    return 1
}

# Last command: its status is the exit status when run and the return status when sourced.
_sandboxes_ensure_docker
