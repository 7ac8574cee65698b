"""Run by test_agent_resume in a fresh process: one phase of an interrupted, resumed thread.

``first``: write a file, then ask to execute (interrupted for approval), and exit.
``second``: a new process, same database (a SQLite file or a PostgreSQL URL) and sandbox
root: approve and finish.
Prints the outcome as JSON on its last line.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from agent_helpers import LocalSandboxes
from langchain_core.messages import ToolMessage
from langgraph.types import Command

from agent import create_sandbox_agent
from agent.persistence import open_persistence
from agent.testing import ScriptedChatModel, call, say


def main() -> None:
    phase, db, root, thread_id = sys.argv[1:5]
    config = {"configurable": {"thread_id": thread_id}}
    warnings.simplefilter("ignore")
    if phase == "first":
        steps = [
            say("", call("write_file", file_path="notes.txt", content="from process one\n")),
            say("", call("execute", command="cat notes.txt; echo pid-differs")),
        ]
        payload: object = {"messages": [{"role": "user", "content": "note and show"}]}
    else:
        steps = [say("resumed")]
        payload = Command(resume={"decisions": [{"type": "approve"}]})
    with open_persistence(db) as persistence:
        graph = create_sandbox_agent(
            ScriptedChatModel(steps=steps),
            sandbox=LocalSandboxes(Path(root)),
            interrupt_on={"execute": True},
            checkpointer=persistence.checkpointer,
            store=persistence.store,
        )
        state = graph.invoke(payload, config)
    results = [str(m.content) for m in state["messages"] if isinstance(m, ToolMessage)]
    print(
        json.dumps(
            {
                "sandbox_id": state["sandbox_id"],
                "interrupted": "__interrupt__" in state,
                "results": results,
                "last": str(state["messages"][-1].content),
            }
        )
    )


if __name__ == "__main__":
    main()
