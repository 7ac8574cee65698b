#!/usr/bin/env bash
# Set up and start the sandbox service on this machine, then use it once through the CLI.
#
#   bash scripts/demo.sh         # install, (re)start the service on 127.0.0.1, run a command in a sandbox
#   bash scripts/demo.sh stop    # delete the demo's sandboxes and stop the service
#
# Backend: Docker when an engine answers here (the runtime image is built offline if missing and
# this is root), else the local backend (bubblewrap, installed if missing). The service listens on
# 127.0.0.1 only, with one API key for tenant "demo". Everything it keeps is in .venv/demo/:
# service.toml, service.log, service.pid, and env (SANDBOXES_URL and SANDBOXES_API_KEY to source).
# Environment: SANDBOXES_DEMO_PORT (default 8080, or a free port when 8080 is taken).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$(pwd)
state=$repo/.venv/demo
python=$repo/.venv/bin/python
cli=$repo/.venv/bin/sandboxes

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'demo.sh: ERROR: %s\n' "$*" >&2; exit 1; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

running_pid() {
    local pid
    pid=$(cat "$state/service.pid" 2>/dev/null) || return 1
    grep -qs sandboxes.server "/proc/$pid/cmdline" && echo "$pid"
}

stop_service() {
    local pid i
    pid=$(running_pid) || return 0
    kill -TERM "$pid"
    for i in $(seq 60); do
        [ -d "/proc/$pid" ] || return 0
        sleep 0.5
    done
    die "the service (pid $pid) did not stop in 30s"
}

if [ "${1:-}" = stop ]; then
    if pid=$(running_pid); then
        # shellcheck disable=SC1091
        source "$state/env"
        for id in $("$cli" ls); do "$cli" rm "$id" && say "deleted sandbox $id"; done
        stop_service
        say "stopped the service (pid $pid)"
    else
        say "the service is not running"
    fi
    exit 0
fi

say "installing the package with the server and docker extras into .venv"
[ -x "$python" ] || python3 -m venv .venv
"$python" -m pip install -qq -e '.[server,docker]'
mkdir -p "$state"
chmod 700 "$state"

version=$(tr -d '[:space:]' <images/VERSION)
backend=local
if docker info >/dev/null 2>&1; then
    if ! docker image inspect "sandboxes/runtime:$version" >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
        say "building the sandbox image sandboxes/runtime:$version (offline, a few minutes the first time)"
        bash images/build.sh runtime
    fi
    if ! docker image inspect "sandboxes/code-interpreter:$version" >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] \
        && docker image inspect "sandboxes/runtime:$version" >/dev/null 2>&1; then
        say "building the code interpreter image sandboxes/code-interpreter:$version (its libraries from PyPI)"
        bash images/build.sh code-interpreter || say "the code interpreter image did not build: E2B's code-interpreter-v1 is off"
    fi
    if docker image inspect "sandboxes/runtime:$version" >/dev/null 2>&1; then
        backend=docker
    else
        say "Docker answers but sandboxes/runtime:$version is missing (build it: sudo bash images/build.sh)"
    fi
fi
if ! command -v bwrap >/dev/null 2>&1 && [ "$backend" = local ]; then
    say "installing bubblewrap, which isolates local sandboxes"
    as_root apt-get install -y -q bubblewrap >/dev/null || { as_root apt-get update -q && as_root apt-get install -y -q bubblewrap; }
fi
say "backend: $backend"

stop_service  # a previous run's service: its sandboxes are adopted by the new one
port=${SANDBOXES_DEMO_PORT:-8080}
if ! "$python" -c 'import socket, sys; socket.create_server(("127.0.0.1", int(sys.argv[1]))).close()' "$port" 2>/dev/null; then
    port=$("$python" -c 'import socket; s = socket.create_server(("127.0.0.1", 0)); print(s.getsockname()[1])')
    say "port ${SANDBOXES_DEMO_PORT:-8080} is taken; using $port"
fi
url=http://127.0.0.1:$port

# One API key for tenant "demo", kept across runs; the service stores only its SHA-256.
if [ -s "$state/key" ]; then
    key=$(cat "$state/key")
else
    key=$("$python" -m sandboxes.server --new-key demo | sed -n 's/^API key[^:]*: //p')
    (umask 077 && printf '%s\n' "$key" >"$state/key")
fi
digest=$(printf '%s\n' "$key" | "$python" -m sandboxes.server --hash-key)

{
    printf 'host = "127.0.0.1"\nport = %s\ndata_dir = "%s/data"\nowner = "sandboxes-demo"\n\n' "$port" "$state"
    if [ "$backend" = docker ]; then
        printf '[templates.default]\nbackend = "docker"\nimage = "sandboxes/runtime:%s"\n\n' "$version"
        if docker image inspect "sandboxes/code-interpreter:$version" >/dev/null 2>&1; then
            # E2B's code-interpreter-v1: a Jupyter server on port 49999, up before the create answers.
            printf '[templates.code-interpreter]\nbackend = "docker"\nimage = "sandboxes/code-interpreter:%s"\n' "$version"
            printf 'memory = "1g"\nstart = "/opt/code-interpreter/bin/python /opt/code-interpreter/server.py"\n'
            printf 'ready_port = 49999\n\n'
        fi
    else
        printf '[templates.default]\nbackend = "local"\n\n'
    fi
    printf '[api_keys]\n"%s" = "demo"\n' "$digest"
} >"$state/service.toml"
(umask 077 && printf 'export SANDBOXES_URL=%s\nexport SANDBOXES_API_KEY=%s\n' "$url" "$key" >"$state/env")

say "starting the service on $url (log: .venv/demo/service.log)"
nohup "$python" -m sandboxes.server --config "$state/service.toml" >>"$state/service.log" 2>&1 &
echo $! >"$state/service.pid"
for _ in $(seq 120); do
    pid=$(running_pid) || { tail -n 20 "$state/service.log" >&2; die "the service exited"; }
    if "$python" -c 'import httpx, sys; sys.exit(httpx.get(sys.argv[1] + "/readyz", timeout=2).status_code != 200)' \
        "$url" 2>/dev/null; then
        break
    fi
    sleep 0.5
done
"$python" -c 'import httpx, sys; httpx.get(sys.argv[1] + "/readyz", timeout=2).raise_for_status()' "$url" \
    || { tail -n 20 "$state/service.log" >&2; die "the service did not become ready"; }

# shellcheck disable=SC1091
source "$state/env"
show() { printf '\033[2m$ %s\033[0m\n' "$*" >&2; }
show "sandboxes create"
id=$("$cli" create)
echo "$id"
show "sandboxes exec --sandbox $id 'echo \"hello from uid \$(id -u) in \$(pwd)\"; uname -sr'"
"$cli" exec --sandbox "$id" 'echo "hello from uid $(id -u) in $(pwd)"; uname -sr'
printf 'print(sum(range(101)))\n' >"$state/sum.py"
show "sandboxes cp .venv/demo/sum.py $id:sum.py && sandboxes exec --sandbox $id python3 sum.py"
"$cli" cp "$state/sum.py" "$id:sum.py"
"$cli" exec --sandbox "$id" python3 sum.py
show "sandboxes ls -l"
"$cli" ls -l

cat >&2 <<EOF

The service is running ($backend backend, pid $pid, $url), and sandbox $id is yours for an hour:
  source .venv/demo/env            # SANDBOXES_URL and SANDBOXES_API_KEY
  .venv/bin/sandboxes exec --sandbox $id 'ls -la'
  .venv/bin/sandboxes cp $id:sum.py /tmp/sum.py
  .venv/bin/sandboxes rm $id
  curl -H "Authorization: Bearer \$SANDBOXES_API_KEY" $url/v1/sandboxes     # the HTTP API ($url/v1/openapi.json)
Stop it: bash scripts/demo.sh stop
EOF
