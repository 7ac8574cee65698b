#!/bin/sh
# Entry point of the service image: say plainly why the Docker socket cannot be used (the
# commonest mistake: running without --group-add), then hand over to the service.
set -eu

case "${DOCKER_HOST:-unix:///var/run/docker.sock}" in
    unix://*)
        socket=${DOCKER_HOST:-unix:///var/run/docker.sock}
        socket=${socket#unix://}
        if [ -S "$socket" ] && ! { [ -r "$socket" ] && [ -w "$socket" ]; }; then
            gid=$(stat -c %g "$socket")
            echo "sandboxes-service: uid $(id -u) cannot use the Docker socket $socket (group $gid);" \
                "run the container with --group-add $gid" >&2
            exit 2
        fi
        ;;
esac

exec python -m sandboxes.server "$@"
