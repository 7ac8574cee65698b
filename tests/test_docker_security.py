"""DockerSandbox's secure defaults, attacked from inside the sandbox.

Every test runs the attack through ``sandbox.execute`` (or a file operation), asserts that it
failed for the reason the default gives, and then that the sandbox and the host survived it:
the same sandbox still runs commands and moves files, the container is still running, and the
Docker engine still answers. Where it is cheap, a sandbox with that default loosened shows the
same probe succeeding, so each check is known to discriminate rather than pass vacuously.

Network probes never leave the machine: the only non-local address used is 192.0.2.1
(TEST-NET-1), and only inside ``network_mode=none`` containers, where the kernel has no route
and refuses before any packet exists.
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker.errors
import pytest
from support import SESSION_OWNER

from sandboxes import protocol as p
from sandboxes.docker import DockerSandbox, DockerSandboxConfig

CPUS = 0.5
MEMORY = "128m"
PIDS = 64
TMP_SIZE = "8m"
DISK = "32m"
UID = 1000
BIG = 2 << 20
"""Above `sandboxes.docker.BULK_THRESHOLD`: big uploads take the tar-stream path when they can."""


def _config(image: str, **overrides: Any) -> DockerSandboxConfig:
    limits: dict[str, Any] = {"cpus": CPUS, "memory": MEMORY, "pids": PIDS, "tmp_size": TMP_SIZE, "disk": DISK}
    return DockerSandboxConfig(image=image, owner=SESSION_OWNER, **{**limits, **overrides})


def _python(source: str) -> str:
    return "python3 -c " + shlex.quote(source)


def _run(sandbox: DockerSandbox, command: str, timeout: float = 20) -> p.ExecuteResponse:
    return sandbox.execute(command, timeout=timeout)


def _status(sandbox: DockerSandbox) -> dict[str, str]:
    """/proc/self/status of a command in the sandbox, as seen by that command."""
    response = _run(sandbox, "cat /proc/self/status")
    assert response.exit_code == 0, response
    return {key: value.strip() for key, _, value in (line.partition(":") for line in response.output.splitlines())}


def _assert_healthy(sandbox: DockerSandbox, client: Any) -> None:
    """The attack left the sandbox usable and the host's engine untouched."""
    echoed = sandbox.execute("echo ok", timeout=20)
    assert (echoed.exit_code, echoed.output, echoed.error) == (0, "ok\n", None), echoed
    path = f"/workspace/health-{uuid.uuid4().hex[:8]}.txt"
    assert sandbox.write(path, "still fine").error is None
    assert sandbox.read(path).file_data == p.FileData("still fine")
    assert sandbox.upload_files([(path + ".bin", b"\x00bytes")]) == [p.FileUploadResponse(path + ".bin")]
    assert sandbox.download_files([path + ".bin"])[0].content == b"\x00bytes"
    assert client.ping()
    sandbox.container.reload()
    assert sandbox.container.status == "running"


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def sandbox(docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    """The secure defaults with tight limits; shared by the checks that do not exhaust anything."""
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sb:
        yield sb


@pytest.fixture(scope="module")
def loosened(docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    """Network on and a writable root: the two defaults the config can switch off."""
    config = _config(runtime_image, network=True, read_only_root=False)
    with DockerSandbox.create(config, client=docker_client) as sb:
        yield sb


@pytest.fixture(scope="module")
def unhardened(docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    """The same image and user without ``cap_drop`` and ``no-new-privileges`` (the config has no
    switch for these), driven by a DockerSandbox attached to it."""
    container = docker_client.containers.run(
        runtime_image,
        command=["sleep", "infinity"],
        detach=True,
        init=True,
        user=f"{UID}:{UID}",
        working_dir="/workspace",
        network_mode="none",
        read_only=True,
        labels={"io.sandboxes.test-session": SESSION_OWNER},
    )
    try:
        with DockerSandbox.attach(container.id, client=docker_client, config=_config(runtime_image)) as sb:
            yield sb
    finally:
        container.remove(force=True, v=True)


# ---------------------------------------------------------------------------- network

_NETWORK_PROBE = r"""
import errno, json, socket, time
def attempt(kind, address):
    sock = socket.socket(socket.AF_INET, kind)
    sock.settimeout(5)
    started = time.monotonic()
    try:
        if kind == socket.SOCK_STREAM:
            sock.connect(address)
        else:
            sock.sendto(b"x", address)
        outcome = "ok"
    except OSError as exc:
        outcome = errno.errorcode.get(exc.errno, str(exc))
    return {"outcome": outcome, "seconds": time.monotonic() - started}
print(json.dumps({
    "tcp": attempt(socket.SOCK_STREAM, ("192.0.2.1", 80)),
    "udp": attempt(socket.SOCK_DGRAM, ("192.0.2.1", 53)),
    "loopback": attempt(socket.SOCK_STREAM, ("127.0.0.1", 1)),
}))
"""


def _interfaces(sandbox: DockerSandbox) -> list[str]:
    response = _run(sandbox, "cat /proc/net/dev")
    assert response.exit_code == 0, response
    return sorted(line.split(":")[0].strip() for line in response.output.splitlines()[2:] if ":" in line)


def _routes(sandbox: DockerSandbox) -> list[str]:
    response = _run(sandbox, "cat /proc/net/route")
    assert response.exit_code == 0, response
    return [line for line in response.output.splitlines()[1:] if line.strip()]


def test_network_only_loopback_and_outside_is_unreachable(sandbox: DockerSandbox, docker_client: Any) -> None:
    assert _interfaces(sandbox) == ["lo"]
    assert _routes(sandbox) == []
    response = _run(sandbox, _python(_NETWORK_PROBE))
    assert response.exit_code == 0, response
    result = json.loads(response.output)
    # refused locally (no route), not a timeout: no packet left the container
    for kind in ("tcp", "udp"):
        assert result[kind]["outcome"] == "ENETUNREACH", result
        assert result[kind]["seconds"] < 1.0, result
    # loopback works, so the refusal above is the missing network, not a broken socket layer
    assert result["loopback"]["outcome"] == "ECONNREFUSED", result
    _assert_healthy(sandbox, docker_client)


def test_network_check_discriminates(loosened: DockerSandbox) -> None:
    """With network=True the same probe sees an interface and a route (no traffic is sent)."""
    assert "eth0" in _interfaces(loosened)
    assert _routes(loosened) != []


# ---------------------------------------------------------------------------- non-root


@pytest.mark.parametrize("target", ["/etc/pwned", "/usr/pwned", "/pwned"])
def test_non_root_cannot_write_system_paths(sandbox: DockerSandbox, docker_client: Any, target: str) -> None:
    assert _run(sandbox, "id -u; id -g").output == f"{UID}\n{UID}\n"
    attempt = _run(sandbox, f"echo owned > {target}")
    assert attempt.exit_code != 0
    assert "Read-only file system" in attempt.output
    assert sandbox.write(target, "owned").error == p.PERMISSION_DENIED
    assert _run(sandbox, f"test -e {target}").exit_code == 1
    _assert_healthy(sandbox, docker_client)


def test_workspace_and_tmp_are_writable(sandbox: DockerSandbox) -> None:
    response = _run(sandbox, "echo a > /workspace/w.txt && echo b > /tmp/t.txt && cat /workspace/w.txt /tmp/t.txt")
    assert (response.exit_code, response.output) == (0, "a\nb\n")
    assert sandbox.write("/tmp/via-write.txt", "c").error is None
    assert sandbox.read("/tmp/via-write.txt").file_data == p.FileData("c")


def test_cannot_become_root(sandbox: DockerSandbox, docker_client: Any) -> None:
    response = _run(sandbox, _python("import os; os.setuid(0)"))
    assert response.exit_code != 0
    assert "PermissionError" in response.output
    _assert_healthy(sandbox, docker_client)


def test_non_root_alone_protects_system_paths(loosened: DockerSandbox) -> None:
    """Even with a writable root, uid 1000 cannot write /etc: the two defaults are independent."""
    assert _run(loosened, "id -u").output == f"{UID}\n"
    attempt = _run(loosened, "echo owned > /etc/pwned")
    assert attempt.exit_code != 0
    assert "Permission denied" in attempt.output


# ---------------------------------------------------------------------------- capabilities

_CAPABILITY_ATTACKS = {
    "chown to root": "touch /workspace/mine && chown 0:0 /workspace/mine",
    "mknod": "mknod /tmp/null2 c 1 3",
    "raw socket": _python("import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)"),
    "user namespace as root": "unshare --user --map-root-user id -u",
}


def test_no_capabilities(sandbox: DockerSandbox, docker_client: Any) -> None:
    status = _status(sandbox)
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[field], 16) == 0, (field, status[field])
    for name, command in _CAPABILITY_ATTACKS.items():
        response = _run(sandbox, command)
        assert response.exit_code != 0, (name, response)
        assert "not permitted" in response.output, (name, response)
    assert _run(sandbox, "stat -c %u /workspace/mine").output == f"{UID}\n"
    _assert_healthy(sandbox, docker_client)


def test_capability_check_discriminates(unhardened: DockerSandbox) -> None:
    """Without cap_drop the bounding set is Docker's default one, which a setuid binary could use."""
    assert int(_status(unhardened)["CapBnd"], 16) != 0


# ---------------------------------------------------------------------------- no-new-privileges

_SETUID_PROBE = r"""
import subprocess, sys, time
# su is setuid root in the image: while it waits for a password, its status shows its euid
proc = subprocess.Popen(["su", "-c", "id -u", "root"], stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
uids = None
for _ in range(500):
    with open("/proc/%d/status" % proc.pid) as fh:
        fields = dict(line.split(":", 1) for line in fh.read().splitlines())
    if fields["Name"].strip() == "su":
        uids = fields["Uid"].split()
        break
    time.sleep(0.01)
proc.kill()
proc.wait()
print(" ".join(uids or ["never-exec'd"]))
"""


def _su_uids(sandbox: DockerSandbox) -> list[str]:
    assert _run(sandbox, "stat -c %A%u /usr/bin/su").output == "-rwsr-xr-x0\n"  # setuid root
    response = _run(sandbox, _python(_SETUID_PROBE))
    assert response.exit_code == 0, response
    return response.output.split()


def test_setuid_binaries_do_not_elevate(sandbox: DockerSandbox, docker_client: Any) -> None:
    assert _status(sandbox)["NoNewPrivs"] == "1"
    assert _su_uids(sandbox) == [str(UID)] * 4  # real, effective, saved, filesystem
    attempt = _run(sandbox, "su -c 'id -u' root </dev/null")
    assert attempt.exit_code != 0
    assert "\n0\n" not in "\n" + attempt.output
    _assert_healthy(sandbox, docker_client)


def test_setuid_check_discriminates(unhardened: DockerSandbox) -> None:
    """Without no-new-privileges the same su runs with euid 0."""
    assert _status(unhardened)["NoNewPrivs"] == "0"
    assert _su_uids(unhardened) == [str(UID), "0", "0", "0"]


# ---------------------------------------------------------------------------- pids limit

_FORK_BOMB = r"""
import errno, os, time
time.sleep(0.3)  # let the exec helper finish starting this command (see the helper test below)
children, failure = 0, None
while children < 10000:
    try:
        pid = os.fork()
    except OSError as exc:
        failure = exc
        break
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    children += 1
print("forked", children, "then", failure and errno.errorcode[failure.errno], failure, flush=True)
time.sleep(120)  # hold every pid until the sandbox's timeout kills the whole tree
"""


def test_fork_bomb_hits_the_pids_limit(docker_client: Any, runtime_image: str) -> None:
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sb:
        assert _run(sb, "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max").output == (
            f"{PIDS}\n"
        )
        bomb = sb.execute(_python(_FORK_BOMB), timeout=4)
        assert bomb.error == p.TIMEOUT, bomb
        assert "EAGAIN" in bomb.output, bomb
        forked = int(bomb.output.split()[1])
        assert 0 < forked < PIDS, bomb
        _assert_healthy(sb, docker_client)
        leftover = _run(sb, "ls -d /proc/[0-9]* | wc -l")
        assert int(leftover.output) < 10, leftover  # the tree is gone, not just the parent


def _bash_processes(sandbox: DockerSandbox) -> int:
    response = _run(sandbox, "ps -eo comm= | grep -cx bash; true")
    assert response.exit_code == 0, response
    return int(response.output)


def test_shell_fork_bomb_is_contained(docker_client: Any, runtime_image: str) -> None:
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sb:
        bomb = sb.execute("sleep 0.3; bash -c ':(){ :|:& };:; sleep 100'", timeout=3)
        assert bomb.error == p.TIMEOUT, bomb
        assert "Resource temporarily unavailable" in bomb.output, bomb
        _assert_healthy(sb, docker_client)
        assert _bash_processes(sb) == 0


def test_backgrounded_fork_bomb_does_not_outlive_its_command(docker_client: Any, runtime_image: str) -> None:
    """A bomb that backgrounds itself returns at once; its descendants die with the command."""
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sb:
        bomb = sb.execute("bash -c ':(){ :|:& };:'", timeout=3)
        assert bomb.error is None, bomb
        _assert_healthy(sb, docker_client)
        assert _bash_processes(sb) == 0


_PID_HOG = r"""
import os, signal, time
time.sleep(0.5)  # until the helper has started this command's threads
children = []
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    children.append(pid)
os.kill(children.pop(), signal.SIGKILL)
os.waitpid(-1, 0)
open("/workspace/one-pid-left", "w").close()  # exactly one free pid now
for pid in children:
    os.waitpid(pid, 0)
"""


def test_helper_survives_a_command_it_cannot_fully_start(docker_client: Any, runtime_image: str) -> None:
    """With one pid left, the command's process takes it and the helper has none for its threads:
    the command may fail, but the helper must keep serving."""
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sb, ThreadPoolExecutor(1) as pool:
        sb.execute("true")
        assert sb.helper_driver.mux is not None
        helper_pid = sb.helper_driver.mux.info["pid"]  # the helper's identity: it must be the same one after
        hog = pool.submit(sb.execute, _python(_PID_HOG), timeout=20)
        deadline = time.monotonic() + 10
        while True:  # watched through the engine's archive API, which needs no pid in the container
            try:
                sb.container.get_archive("/workspace/one-pid-left")
                break
            except docker.errors.NotFound:
                assert time.monotonic() < deadline, "the hog never filled the pids limit"
                assert not hog.done(), hog.result()
                time.sleep(0.05)
        starved = sb.execute("sleep 1", timeout=10)
        assert starved.error != p.CONNECTION_LOST, starved
        assert hog.result().exit_code == 0
        _assert_healthy(sb, docker_client)
        assert sb.helper_driver.mux is not None
        assert sb.helper_driver.mux.info["pid"] == helper_pid


# ---------------------------------------------------------------------------- memory limit


@pytest.mark.parametrize("use_exec_helper", [True, False], ids=["helper", "docker-exec"])
def test_memory_hog_is_oom_killed_and_reported(docker_client: Any, runtime_image: str, use_exec_helper: bool) -> None:
    with DockerSandbox.create(_config(runtime_image, use_exec_helper=use_exec_helper), client=docker_client) as sb:
        hog = sb.execute(_python("data = b'x' * (512 << 20); print(len(data))"), timeout=30)
        assert hog.exit_code == 137, hog
        assert hog.error == p.OUT_OF_MEMORY, hog
        assert str(512 << 20) not in hog.output
        _assert_healthy(sb, docker_client)
        # a plain SIGKILL also exits 137, and must not be mistaken for the OOM killer
        killed = sb.execute("kill -9 $$")
        assert (killed.exit_code, killed.error) == (137, None), killed


# ---------------------------------------------------------------------------- CPU limit

_CPU_PROBE = r"""
import json, os, time
if os.path.exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):  # cgroup v1
    base = "/sys/fs/cgroup/cpu/"
    quota = int(open(base + "cpu.cfs_quota_us").read())
    period = int(open(base + "cpu.cfs_period_us").read())
else:  # cgroup v2
    base = "/sys/fs/cgroup/"
    quota, period = (int(v) for v in open(base + "cpu.max").read().split())
def throttled():
    return int(dict(line.split() for line in open(base + "cpu.stat"))["nr_throttled"])
before, cpu, started = throttled(), time.process_time(), time.monotonic()
# spin until the kernel throttles us (a busy host may take a few periods to let us reach the
# quota), bounded: with no quota this runs the full 3 s and reports no throttling
while time.monotonic() - started < 3 and (time.monotonic() - started < 0.5 or throttled() == before):
    pass
wall = time.monotonic() - started
print(json.dumps({"quota": quota, "period": period, "throttled": throttled() - before,
                  "busy_share": (time.process_time() - cpu) / wall}))
"""


def test_cpu_quota_holds_a_busy_loop(sandbox: DockerSandbox, docker_client: Any) -> None:
    assert docker_client.api.inspect_container(sandbox.id)["HostConfig"]["NanoCpus"] == int(CPUS * 1e9)
    response = _run(sandbox, _python(_CPU_PROBE))
    assert response.exit_code == 0, response
    result = json.loads(response.output)
    assert result["quota"] / result["period"] == CPUS, result
    assert result["throttled"] > 0, result  # the kernel stopped the loop at the quota
    assert result["busy_share"] < CPUS + 0.3, result  # one busy thread gets ~CPUS of a core, not all of it
    _assert_healthy(sandbox, docker_client)


# ---------------------------------------------------------------------------- read-only root


def test_root_filesystem_is_read_only(sandbox: DockerSandbox, docker_client: Any) -> None:
    attempt = _run(sandbox, "touch /x")
    assert attempt.exit_code != 0
    assert "Read-only file system" in attempt.output
    # the user owns its home directory, so only the read-only root stops this one
    owned = _run(sandbox, "stat -c %u /home/sandbox && touch /home/sandbox/x")
    assert owned.exit_code != 0
    assert owned.output.startswith(f"{UID}\n")
    assert "Read-only file system" in owned.output
    _assert_healthy(sandbox, docker_client)


def test_read_only_check_discriminates(loosened: DockerSandbox) -> None:
    response = _run(loosened, "touch /home/sandbox/x && echo written")
    assert (response.exit_code, response.output) == (0, "written\n")


def test_uploads_outside_the_workspace_fail_per_file(sandbox: DockerSandbox, docker_client: Any) -> None:
    big = b"\x01" * BIG
    results = sandbox.upload_files(
        [("/etc/small", b"x"), ("/etc/big", big), ("/workspace/big.bin", big), ("/home/sandbox/big", big)]
    )
    assert [r.path for r in results] == ["/etc/small", "/etc/big", "/workspace/big.bin", "/home/sandbox/big"]
    assert [r.error for r in results] == [p.PERMISSION_DENIED, p.PERMISSION_DENIED, None, p.PERMISSION_DENIED]
    assert sandbox.download_files(["/workspace/big.bin"])[0].content == big
    assert _run(sandbox, "ls /etc/small /etc/big /home/sandbox/big").exit_code != 0
    _assert_healthy(sandbox, docker_client)


def test_engine_refuses_archives_into_the_root(sandbox: DockerSandbox, docker_client: Any) -> None:
    """The daemon's archive API (what big uploads use) cannot bypass the read-only root either."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("etc/injected")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(docker.errors.APIError, match="read-only"):
        docker_client.api.put_archive(sandbox.id, "/", buffer.getvalue())
    assert _run(sandbox, "test -e /etc/injected").exit_code == 1
    _assert_healthy(sandbox, docker_client)


# ---------------------------------------------------------------------------- /tmp


def test_tmp_is_a_small_nosuid_tmpfs(sandbox: DockerSandbox, docker_client: Any) -> None:
    mounts = _run(sandbox, "cat /proc/mounts").output.splitlines()
    tmp = next(line.split() for line in mounts if line.split()[1] == "/tmp")
    assert tmp[2] == "tmpfs"
    assert {"nosuid", "nodev", "size=8192k"} <= set(tmp[3].split(","))
    fill = _run(sandbox, "head -c 16M /dev/zero > /tmp/fill; rc=$?; rm -f /tmp/fill; exit $rc")
    assert fill.exit_code != 0
    assert "No space left on device" in fill.output
    _assert_healthy(sandbox, docker_client)


# ---------------------------------------------------------------------------- host exposure

_DOCKER_ADDED = {"/etc/resolv.conf", "/etc/hostname", "/etc/hosts", "/usr/sbin/docker-init", "/sbin/docker-init"}
"""Files Docker itself bind-mounts into every container (read-only, not host directories)."""


def test_no_docker_socket_and_no_host_paths(sandbox: DockerSandbox, docker_client: Any) -> None:
    sockets = _run(sandbox, "ls -l /var/run/docker.sock /run/docker.sock")
    assert sockets.exit_code != 0
    assert sockets.output.count("No such file or directory") == 2
    found = _run(sandbox, r"find / \( -path /proc -o -path /sys \) -prune -o -type s -print 2>/dev/null; true")
    assert found.output == ""  # no unix socket anywhere on the filesystem
    mounts = [line.split() for line in _run(sandbox, "cat /proc/mounts").output.splitlines()]
    from_disk = {target for source, target, *_ in mounts if source.startswith("/dev/")} - _DOCKER_ADDED
    assert from_disk == set()  # the workspace is a size-limited tmpfs, not the engine's disk
    workspace = next(fields for fields in mounts if fields[1] == "/workspace")
    assert workspace[2] == "tmpfs", workspace
    assert {"size=32768k", "nosuid", "nodev"} <= set(workspace[3].split(",")), workspace
    for target in _DOCKER_ADDED & {target for _, target, *_ in mounts}:
        options = next(fields[3] for fields in mounts if fields[1] == target)
        assert options.startswith("ro"), (target, options)

    info = docker_client.api.inspect_container(sandbox.id)
    (mount,) = info["Mounts"]
    assert (mount["Type"], mount["Destination"], mount["RW"]) == ("volume", "/workspace", True)
    assert mount["Name"].startswith("sandboxes-ws-")
    host = info["HostConfig"]
    assert host["Binds"] == [f"{mount['Name']}:/workspace:rw"]  # the volume, by name: no host path
    assert not host["Privileged"]
    assert not host["Devices"]
    assert host["CapDrop"] == ["ALL"]
    assert not host["CapAdd"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["ReadonlyRootfs"] is True
    assert host["NetworkMode"] == "none"
    assert host["PidMode"] != "host"
    assert host["IpcMode"] != "host"
    assert host["Memory"] == host["MemorySwap"] == (128 + 32) << 20  # memory + the workspace; no swap
    assert host["LogConfig"] == {"Type": "json-file", "Config": {"max-file": "1", "max-size": "1m"}}
    assert host["PidsLimit"] == PIDS
    _assert_healthy(sandbox, docker_client)
