"""The agent framework's own cost per step, beside the same tool calls made directly on the backend.

An episode is a scripted model (no think time) making one tool call per step (write, read,
edit, grep, glob, ls, execute, in turn) and then answering. The same calls are then made
directly on the sandbox, with the same arguments, in the same round, so machine noise hits
both. What the agent adds per step (model plumbing, middleware, tool node, state reducers,
the checkpointer if any) is

    overhead per step = (episode time - direct time) / steps

The same episode also runs on langchain's `create_agent` alone with plain tools calling the
sandbox (``bare``), which splits the overhead into langchain/langgraph's and this package's.

The target is a ratio to that bare agent, in this process's CPU time per step (threads
included, the sandbox's own processes not), which a loaded machine disturbs far less than
wall time: ours <= TARGET_RATIO x bare. The ratio sits below what deepagents'
`create_deep_agent` (the same kind of stack: todos, files, subagents, summarization, patched
tool calls, each a wrapper or a graph node per step) costs over bare by the same measure, so
this package stays cheaper than the stack it replaces.

Rows: each backend (LocalSandbox, DockerSandbox) with no checkpointer, with SQLite saving every
step (langgraph's default durability), and with SQLite saving only when the run stops
(``durability="exit"``: an interrupt or a crash mid-run loses the steps since the last save).

    python benchmarks/bench_agent.py [--rounds N] [--cycles N] [--backends local,docker] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import machine
from _common import ok as _ok
from _common import percentile as _percentile
from _common import timed as _timed
from langchain.agents import create_agent

from agent import FixedSandbox, create_sandbox_agent
from agent.persistence import open_sqlite
from agent.testing import ScriptedChatModel, call, say
from sandboxes import protocol as p

TARGET_RATIO = 1.75
"""Ours over bare langchain, CPU per step."""
CONTENT = "alpha\n" + "needle in a haystack\n" * 20


def step_calls(workdir: str) -> list[tuple[str, dict[str, Any], Callable[[p.SandboxBackendProtocol], object]]]:
    """One cycle: (tool name, tool args, the same call made directly)."""
    path = f"{workdir}/bench.txt"
    return [
        ("write_file", {"file_path": "bench.txt", "content": CONTENT}, lambda s: s.write(path, CONTENT)),
        ("read_file", {"file_path": "bench.txt"}, lambda s: s.read(path, 0, 2000)),
        (
            "edit_file",
            {"file_path": "bench.txt", "old_string": "alpha", "new_string": "omega"},
            lambda s: s.edit(path, "alpha", "omega"),
        ),
        ("grep", {"pattern": "needle"}, lambda s: s.grep("needle", workdir)),
        ("glob", {"pattern": "*.txt"}, lambda s: s.glob("*.txt", workdir)),
        ("ls", {}, lambda s: s.ls(workdir)),
        ("execute", {"command": "true"}, lambda s: s.execute("true", cwd=workdir)),
    ]


@dataclass(frozen=True)
class Row:
    backend: str
    persistence: str
    steps: int
    agent_ms_per_step: float
    bare_ms_per_step: float
    """The same episode on langchain's create_agent with plain tools: no middleware of ours."""
    direct_ms_per_step: float
    overhead_ms_per_step: float
    overhead_p90_ms: float
    ours_over_bare_ms: float
    """What this package adds per step over bare langchain."""
    agent_cpu_ms_per_step: float
    bare_cpu_ms_per_step: float
    cpu_ratio: float
    """Median over rounds of agent CPU / bare CPU: the figure the target is set on."""


@contextlib.contextmanager
def sandbox_for(backend: str) -> Iterator[p.SandboxBackendProtocol]:
    if backend == "local":
        from sandboxes.local import LocalSandbox

        with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with LocalSandbox(root) as sandbox:
                yield sandbox
    elif backend == "docker":
        from sandboxes.docker import DockerSandbox

        with DockerSandbox.create() as sandbox:
            yield sandbox
    else:
        raise SystemExit(f"unknown backend {backend!r}")


@contextlib.contextmanager
def checkpointer_for(persistence: str) -> Iterator[Any]:
    if persistence == "none":
        yield None
        return
    if persistence not in ("sqlite", "sqlite-exit"):
        raise SystemExit(f"unknown persistence {persistence!r}")
    with tempfile.TemporaryDirectory() as directory, open_sqlite(Path(directory) / "bench.sqlite") as stored:
        yield stored.checkpointer


def workdir_of(sandbox: p.SandboxBackendProtocol) -> str:
    """Where the sandbox's files live, as the agent sees it."""
    return FixedSandbox(sandbox).workdir(sandbox)


def bare_agent(sandbox: p.SandboxBackendProtocol, model: ScriptedChatModel, checkpointer: Any) -> Any:
    """langchain's `create_agent` alone, with plain tools calling the sandbox: the baseline that
    shows what this package's layer (middleware, workspace, rendering) adds on top."""
    workdir = workdir_of(sandbox)

    def at(path: str | None) -> str:
        return workdir if not path else path if path.startswith("/") else f"{workdir}/{path}"

    def write_file(file_path: str, content: str) -> str:
        """Write."""
        return str(sandbox.write(at(file_path), content))

    def read_file(file_path: str, offset: int = 0, limit: int = 2000) -> str:
        """Read."""
        return str(sandbox.read(at(file_path), offset, limit))

    def edit_file(file_path: str, old_string: str, new_string: str) -> str:
        """Edit."""
        return str(sandbox.edit(at(file_path), old_string, new_string))

    def grep(pattern: str, path: str | None = None) -> str:
        """Grep."""
        return str(sandbox.grep(pattern, at(path)))

    def glob(pattern: str, path: str | None = None) -> str:
        """Glob."""
        return str(sandbox.glob(pattern, at(path)))

    def ls(path: str | None = None) -> str:
        """Ls."""
        return str(sandbox.ls(at(path)))

    def execute(command: str) -> str:
        """Execute."""
        return str(sandbox.execute(command, cwd=workdir))

    tools = [write_file, read_file, edit_file, grep, glob, ls, execute]
    return create_agent(model, tools, checkpointer=checkpointer)


def one_round(
    sandbox: p.SandboxBackendProtocol, checkpointer: Any, cycles: int, round_no: int, durability: str = "async"
) -> tuple[float, float, float, float, float]:
    """Milliseconds of one episode, of the same episode on bare langchain, and of the calls made
    directly; then the CPU milliseconds of the episode and of the bare one."""
    calls = step_calls(workdir_of(sandbox)) * cycles

    def script() -> ScriptedChatModel:
        return ScriptedChatModel(steps=[say("", call(name, **args)) for name, args, _ in calls] + [say("done")])

    graph = create_sandbox_agent(script(), sandbox=FixedSandbox(sandbox), checkpointer=checkpointer)
    bare = bare_agent(sandbox, script(), checkpointer)
    task = {"messages": [{"role": "user", "content": "bench"}]}
    path = f"{workdir_of(sandbox)}/bench.txt"
    _ok(sandbox.write(path, CONTENT))
    config = {"configurable": {"thread_id": f"bench-{round_no}"}}
    agent_ms, agent_cpu = _wall_and_cpu(lambda: graph.invoke(task, config, durability=durability))  # type: ignore[arg-type]
    _ok(sandbox.write(path, CONTENT))
    config = {"configurable": {"thread_id": f"bench-bare-{round_no}"}}
    bare_ms, bare_cpu = _wall_and_cpu(lambda: bare.invoke(task, config, durability=durability))
    _ok(sandbox.write(path, CONTENT))
    direct_ms = _timed(lambda: [_ok(direct(sandbox)) for _, _, direct in calls])
    return agent_ms, bare_ms, direct_ms, agent_cpu, bare_cpu


def _wall_and_cpu(fn: Callable[[], object]) -> tuple[float, float]:
    """Milliseconds ``fn`` took, on the clock and in this process's CPU time."""
    cpu = time.process_time_ns()
    wall = _timed(fn)
    return wall, (time.process_time_ns() - cpu) / 1e6


def measure(backend: str, persistence: str, rounds: int, cycles: int) -> Row:
    steps = len(step_calls("/")) * cycles + 1
    durability = "exit" if persistence.endswith("-exit") else "async"
    with sandbox_for(backend) as sandbox, checkpointer_for(persistence) as checkpointer:
        one_round(sandbox, checkpointer, 1, -1, durability)  # warm up: imports, exec helper, tables
        samples = [one_round(sandbox, checkpointer, cycles, n, durability) for n in range(rounds)]
    overheads = [(agent - direct) / steps for agent, _, direct, _, _ in samples]
    return Row(
        backend=backend,
        persistence=persistence,
        steps=steps,
        agent_ms_per_step=statistics.median(s[0] for s in samples) / steps,
        bare_ms_per_step=statistics.median(s[1] for s in samples) / steps,
        direct_ms_per_step=statistics.median(s[2] for s in samples) / steps,
        overhead_ms_per_step=statistics.median(overheads),
        overhead_p90_ms=_percentile(overheads, 0.9),
        ours_over_bare_ms=statistics.median((s[0] - s[1]) / steps for s in samples),
        agent_cpu_ms_per_step=statistics.median(s[3] for s in samples) / steps,
        bare_cpu_ms_per_step=statistics.median(s[4] for s in samples) / steps,
        cpu_ratio=statistics.median(s[3] / s[4] for s in samples),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cycles", type=int, default=3, help="times the 7 tool calls repeat per episode")
    parser.add_argument("--backends", default="local,docker")
    parser.add_argument("--persistence", default="none,sqlite,sqlite-exit")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    host = machine()  # before the run loads the machine
    rows = [
        measure(backend, persistence, args.rounds, args.cycles)
        for backend in args.backends.split(",")
        for persistence in args.persistence.split(",")
    ]
    if args.json:
        json.dump([asdict(r) for r in rows], sys.stdout, indent=2)
        print()
        return
    print(host)
    print(f"agent overhead per step (median of {args.rounds} rounds)")
    print(f"target: ours <= {TARGET_RATIO}x bare langchain create_agent, in CPU ms per step")
    print("ms per step; overhead = agent - direct; ours = agent - bare; cpu = this process's CPU ms")
    header = (
        f"{'backend':8} {'persistence':11} {'steps':>5} {'agent':>7} {'bare':>7} {'direct':>7} "
        f"{'overhead':>9} {'p90':>7} {'ours':>6} {'cpu':>6} {'bare':>6} {'ratio':>6} {'met':>4}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.backend:8} {r.persistence:11} {r.steps:5} {r.agent_ms_per_step:7.2f} {r.bare_ms_per_step:7.2f} "
            f"{r.direct_ms_per_step:7.2f} {r.overhead_ms_per_step:9.2f} {r.overhead_p90_ms:7.2f} "
            f"{r.ours_over_bare_ms:6.2f} {r.agent_cpu_ms_per_step:6.2f} {r.bare_cpu_ms_per_step:6.2f} "
            f"{r.cpu_ratio:5.2f}x {'yes' if r.cpu_ratio <= TARGET_RATIO else 'NO':>4}"
        )


if __name__ == "__main__":
    main()
