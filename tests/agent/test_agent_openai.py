"""End to end through a real provider client: ChatOpenAI against a loopback server speaking the
OpenAI chat-completions wire format; and the ``python -m agent`` command over the same."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import ask, local_provider, tool_results
from langchain_core.messages import AIMessage, RemoveMessage, ToolMessage
from langchain_openai import ChatOpenAI
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from openai_wire import ScriptedOpenAI, reply, tool_call

from agent import ProviderAdapter, create_sandbox_agent
from agent.cli import missing_key, show_update


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def test_an_episode_through_chat_openai(local_provider: ProviderAdapter) -> None:
    script = [
        reply(None, tool_call("c1", "write_file", file_path="hello.py", content="print('hi from openai')\n")),
        reply("running it", tool_call("c2", "execute", command="python3 hello.py || cat hello.py")),
        reply("It printed hi."),
    ]
    with ScriptedOpenAI(script) as server:
        model = ChatOpenAI(model="gpt-scripted", base_url=server.url, api_key="test-key", max_retries=0)  # type: ignore[arg-type]
        state = create_sandbox_agent(model, sandbox=local_provider).invoke(ask("say hi in python"))
    results = tool_results(state)
    assert results["c2"].endswith("[exit code 0]")
    assert "hi from openai" in results["c2"]
    assert state["messages"][-1].content == "It printed hi."
    # The wire: our tools were offered, and each result went back as a tool message for its call.
    first, _, third = server.requests
    offered = {tool["function"]["name"] for tool in first["tools"]}
    assert {"ls", "read_file", "write_file", "edit_file", "glob", "grep", "execute", "task", "write_todos"} <= offered
    assert first["messages"][0]["role"] == "system"
    tool_messages = [m for m in third["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["c1", "c2"]
    assert (local_provider.root / state["sandbox_id"] / "hello.py").read_text() == "print('hi from openai')\n"


def run_cli(tmp_path: Path, url: str, *args: str, answers: str = "") -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "OPENAI_API_KEY": "test-key",
        "OPENAI_BASE_URL": url,
        "OPENAI_API_BASE": url,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "NO_PROXY": "127.0.0.1,localhost",
        "PYTHONWARNINGS": "ignore",
    }
    return subprocess.run(
        [sys.executable, "-m", "agent", *args, "--model", "openai:gpt-scripted"],
        capture_output=True,
        text=True,
        input=answers,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_command_shows_steps_and_resumes_a_thread(tmp_path: Path) -> None:
    todos = [{"content": "write the file", "status": "completed"}, {"content": "check it", "status": "in_progress"}]
    first_script = [
        reply(None, tool_call("t1", "write_todos", todos=todos)),
        reply(None, tool_call("t2", "write_file", file_path="result.txt", content="forty-two\n")),
        reply(None, tool_call("t4", "task", description="check result.txt", subagent_type="general-purpose")),
        reply(None, tool_call("s1", "read_file", file_path="result.txt")),  # the subagent's steps
        reply("It says forty-two."),
        reply("Done: result.txt holds the answer."),
    ]
    with ScriptedOpenAI(first_script) as server:
        first = run_cli(tmp_path, server.url, "write the answer", "--thread", "t-1")
    assert first.returncode == 0, first.stderr
    out = first.stdout
    assert out.splitlines()[0] == "thread t-1 (continue it with --thread t-1)"
    assert "-> write_todos(" in out
    assert "todos:\n  [x] write the file\n  [>] check it" in out
    assert "-> write_file(file_path='result.txt'" in out
    assert "<- write_file:\n    Wrote 10 characters to /workspace/result.txt" in out  # --sandbox local
    assert "  | -> read_file(file_path='result.txt')" in out
    assert "  | <- read_file:\n  |          1\tforty-two" in out
    assert "<- task:\n    It says forty-two." in out
    assert "agent: Done: result.txt holds the answer." in out
    sandbox_line = out.splitlines()[-1]
    assert sandbox_line.startswith(f"sandbox {tmp_path}")

    second_script = [reply(None, tool_call("t3", "execute", command="cat result.txt")), reply("Still there.")]
    with ScriptedOpenAI(second_script) as server:
        second = run_cli(tmp_path, server.url, "is it still there?", "--thread", "t-1")
    assert second.returncode == 0, second.stderr
    assert "<- execute:\n    forty-two\n    [exit code 0]" in second.stdout
    assert second.stdout.splitlines()[-1] == sandbox_line
    # The resumed thread sent the whole conversation: the first run's messages came from SQLite.
    history = [m.get("content") for m in server.requests[0]["messages"]]
    assert "write the answer" in json.dumps(history)


def test_the_command_names_the_missing_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    done = subprocess.run(
        [sys.executable, "-m", "agent", "task", "--model", "anthropic:claude-x"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "set ANTHROPIC_API_KEY" in done.stderr
    assert missing_key("openai:gpt", {"OPENAI_API_KEY": "k"}) is None
    unknown = subprocess.run(
        [sys.executable, "-m", "agent", "task", "--model", "nosuch:model"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("Cannot use nosuch:model: Unable to infer model provider")
    assert "Traceback" not in unknown.stderr
    assert missing_key("ollama:llama3", {}) is None


def test_a_model_without_its_provider_is_one_line_saying_what_to_write() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    for model, advice in (("gpt-4.1", "write --model openai:gpt-4.1"), ("mystery", "e.g. --model openai:gpt-4.1")):
        done = subprocess.run(
            [sys.executable, "-m", "agent", "task", "--model", model],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == f"--model needs provider:model: {advice} (got {model!r})\n"


def test_show_update_prints_calls_results_todos_and_not_a_rewritten_history() -> None:
    out = io.StringIO()
    show_update(
        {
            "messages": [
                AIMessage(
                    "looking", tool_calls=[{"name": "ls", "args": {"path": "/w"}, "id": "1", "type": "tool_call"}]
                ),
                ToolMessage("\n".join(f"f{i}" for i in range(20)), tool_call_id="1", name="ls"),
            ],
            "todos": [{"content": "list", "status": "completed"}, {"content": "read", "status": "pending"}],
        },
        out,
    )
    assert out.getvalue().splitlines() == [
        "agent: looking",
        "-> ls(path='/w')",
        "<- ls:",
        *[f"    f{i}" for i in range(8)],
        "    ... (12 more lines)",
        "todos:",
        "  [x] list",
        "  [ ] read",
    ]
    out = io.StringIO()
    show_update({"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), AIMessage("old")]}, out)
    assert out.getvalue() == "(history rewritten: unanswered tool calls marked cancelled)\n"
    out = io.StringIO()
    show_update({"messages": [AIMessage("inside a subagent")]}, out, depth=1)
    assert out.getvalue() == "  | agent: inside a subagent\n"


def test_the_command_asks_before_approved_tools(tmp_path: Path) -> None:
    script = [
        reply(None, tool_call("x1", "execute", command="echo one > a.txt")),
        reply(None, tool_call("x2", "execute", command="echo two > b.txt")),
        reply(None, tool_call("x3", "execute", command="echo three > c.txt")),
        reply("Three asked, two ran."),
    ]
    answers = 'y\nn too risky\ne {"command": "echo edited > c.txt"}\n'
    with ScriptedOpenAI(script) as server:
        done = run_cli(tmp_path, server.url, "three files", "--approve", "execute", answers=answers)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert 'approve execute {"command": "echo one > a.txt"}? [y / n reason / e {json args}] y' in out
    assert "n too risky" in out
    assert "agent: Three asked, two ran." in out
    workdir = tmp_path / "state" / "sandboxes-agent" / "local" / out.splitlines()[-1].removeprefix("sandbox ")
    assert (workdir / "a.txt").read_text() == "one\n"
    assert not (workdir / "b.txt").exists()
    assert (workdir / "c.txt").read_text() == "edited\n"
    rejected = [m for m in server.requests[2]["messages"] if m.get("tool_call_id") == "x2"]
    assert "too risky" in rejected[0]["content"]


__all__ = ["local_provider"]
