"""Native ``metrics`` in the exec helper: what the sandbox uses now (CPU time so far, memory,
disk), read from the kernel without starting a process (imported with `_files`: stdlib only,
Python 3.6-compatible).

The op is ``["metrics", workdir, mode]``; its answer is exit 0 and one JSON object (`_json`):
``source`` (``cgroup``: the helper's own cgroup, which holds every process of the sandbox;
``processes``: the sum over the processes of the helper's uid that it can see; ``none``),
``cpu_usec`` (CPU time used so far, microseconds), ``cpu_limit_millicores`` (the cgroup's CPU
bandwidth), ``cpus`` (CPUs online), ``mem_used`` and ``mem_limit`` (bytes), ``disk_used`` and
``disk_total`` (bytes of the filesystem holding ``workdir``, as ``statvfs`` counts them: no
walk of the tree). A value that cannot be read is ``null``, never a guess.

A cgroup is the sandbox's own only where it is not the root of the hierarchy the helper sees:
under cgroup v2 the root has no ``memory.current`` (a container's cgroup namespace root has
it), under v1 the helper's path must not be ``/`` (that is the host's root: a jail's cgroup
namespace, or no cgroup at all). ``mode`` ``processes`` skips the cgroup (SSH: the cgroup a
login lands in may be the whole SSH service's). Processes are counted up to `MAX_PROCESSES`;
past that the CPU and memory are ``null``. Memory in ``processes`` is the sum of resident sets
(shared pages counted once per process); CPU is each process's own and its waited-for
children's time, so a process that ends unwaited takes its time with it.
"""

import os

from ._loop import _json

USAGE_OPS = ["metrics"]
MAX_PROCESSES = 4096
UNLIMITED = 1 << 60
"""A cgroup v1 limit at or past this is "no limit" (the kernel's is ``PAGE_COUNTER_MAX`` pages)."""
_READ_LIMIT = 8192
_CGROUP_ROOT = "/sys/fs/cgroup"
_V1_CPUACCT = ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")
_V1_CPU = ("cpu", "cpu,cpuacct", "cpuacct,cpu")
_DIGITS = "0123456789"


def usage(op: "list[str]") -> "tuple[int, bytes]":
    """The ``metrics`` op's answer (ValueError when malformed)."""
    if len(op) != 3 or op[2] not in ("cgroup", "processes") or not op[1].startswith("/") or "\0" in op[1]:
        raise ValueError("metrics takes a workdir and a mode")
    answer: "dict[str, object]" = {"source": "none", "cpu_usec": None, "cpu_limit_millicores": None}
    answer.update({"mem_used": None, "mem_limit": None, "cpus": os.cpu_count()})
    found = _cgroup() if op[2] == "cgroup" else None
    if found is None:
        found = _processes()
    answer.update(found)
    answer.update(_disk(op[1]))
    return 0, _json(answer).encode("ascii")


def _read(path: str) -> "str | None":
    """The first `_READ_LIMIT` bytes of ``path`` as text, or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        return os.read(fd, _READ_LIMIT).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _number(text: "str | None") -> "int | None":
    """A non-negative decimal integer of at most 20 digits, or None."""
    if text is None:
        return None
    text = text.strip()
    if not text or len(text) > 20 or text.strip(_DIGITS):
        return None
    return int(text)


def _field(text: "str | None", name: str) -> "int | None":
    """``name``'s value in a ``key value`` per line file (``cpu.stat``)."""
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == name:
            return _number(parts[1])
    return None


def _own_cgroups() -> "dict[str, str]":
    """Controllers (v1: each name; v2: ``""``) -> the helper's cgroup path, from /proc/self/cgroup."""
    paths: "dict[str, str]" = {}
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def _cgroup() -> "dict[str, object] | None":
    paths = _own_cgroups()
    if os.path.exists(_CGROUP_ROOT + "/cgroup.controllers"):
        return _cgroup_v2(paths.get(""))
    return _cgroup_v1(paths)


def _directory(mount: str, path: "str | None") -> "str | None":
    """The cgroup ``path`` under ``mount``, or ``mount`` itself where the runtime mounted the
    sandbox's own cgroup there (a container: the path is the host's, the mount its own)."""
    if path is None or not os.path.isdir(mount):
        return None
    joined = mount + path.rstrip("/")
    return joined if os.path.isdir(joined) else mount


def _cgroup_v2(path: "str | None") -> "dict[str, object] | None":
    directory = _directory(_CGROUP_ROOT, path)
    if directory is None:
        return None
    used = _number(_read(directory + "/memory.current"))
    if used is None:  # the root: the host's, not the sandbox's
        return None
    limit = _read(directory + "/memory.max")
    cpu = (_read(directory + "/cpu.max") or "").split()
    quota, period = (_number(cpu[0]), _number(cpu[1])) if len(cpu) == 2 else (None, None)
    return {
        "source": "cgroup",
        "cpu_usec": _field(_read(directory + "/cpu.stat"), "usage_usec"),
        "cpu_limit_millicores": quota * 1000 // period if quota is not None and period else None,
        "mem_used": used,
        "mem_limit": _number(limit),  # "max": None
    }


def _cgroup_v1(paths: "dict[str, str]") -> "dict[str, object] | None":
    memory_path = paths.get("memory")
    if memory_path is None or memory_path == "/":
        return None
    memory = _directory(_CGROUP_ROOT + "/memory", memory_path)
    if memory is None:
        return None
    used = _number(_read(memory + "/memory.usage_in_bytes"))
    if used is None:
        return None
    limit = _number(_read(memory + "/memory.limit_in_bytes"))
    answer: "dict[str, object]" = {"source": "cgroup", "mem_used": used}
    answer["mem_limit"] = limit if limit is not None and limit < UNLIMITED else None
    for mount in _V1_CPUACCT:
        directory = _directory(_CGROUP_ROOT + "/" + mount, paths.get("cpuacct"))
        nanoseconds = None if directory is None else _number(_read(directory + "/cpuacct.usage"))
        if nanoseconds is not None:
            answer["cpu_usec"] = nanoseconds // 1000
            break
    for mount in _V1_CPU:
        directory = _directory(_CGROUP_ROOT + "/" + mount, paths.get("cpu"))
        if directory is None:
            continue
        quota = _number(_read(directory + "/cpu.cfs_quota_us"))  # -1 (no limit): None
        period = _number(_read(directory + "/cpu.cfs_period_us"))
        if quota is not None and period:
            answer["cpu_limit_millicores"] = quota * 1000 // period
        break
    return answer


def _processes() -> "dict[str, object]":
    """The sum over the processes of this uid, or nulls past `MAX_PROCESSES` of them."""
    try:
        names = [name for name in os.listdir("/proc") if name.isdigit()]
        ticks = os.sysconf("SC_CLK_TCK")
        page = os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return {}
    if len(names) > MAX_PROCESSES or ticks <= 0 or page <= 0:
        return {"source": "processes"}
    me, cpu, rss = os.getuid(), 0, 0
    for name in names:
        try:
            if os.stat("/proc/" + name).st_uid != me:
                continue
        except OSError:
            continue
        text = _read("/proc/" + name + "/stat")
        fields = (text or "").rpartition(")")[2].split()
        times = [_number(value) for value in fields[11:15]]  # utime, stime, cutime, cstime
        resident = _number(fields[21]) if len(fields) > 21 else None
        if len(times) == 4 and None not in times and resident is not None:
            cpu += sum(t for t in times if t is not None)
            rss += resident
    return {"source": "processes", "cpu_usec": cpu * 1000000 // ticks, "mem_used": rss * page}


def _disk(workdir: str) -> "dict[str, object]":
    try:
        vfs = os.statvfs(workdir)
    except OSError:
        return {"disk_used": None, "disk_total": None}
    return {
        "disk_used": (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize,
        "disk_total": vfs.f_blocks * vfs.f_frsize,
    }
