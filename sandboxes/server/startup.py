"""What a template starts in each of its new sandboxes (`TemplateConfig.start`): a server it
offers, such as the code interpreter's, started as a background job before the create answers,
and waited for on its port (`TemplateConfig.ready_port`) so the first call finds it listening.

A sandbox whose start command failed, or whose port did not open in time, is not handed out:
`start_template` raises `SandboxStartError` with the command's last output, and the caller
destroys the sandbox.
"""

from __future__ import annotations

import shlex

from sandboxes.base import BaseSandbox
from sandboxes.jobs import JobError, JobRunner
from sandboxes.lifecycle import SandboxStartError
from sandboxes.templates import TemplateConfig

__all__ = ["start_template"]

_KEPT_OUTPUT = 16 << 10
"""Bytes of the start command's output kept in the sandbox, head and tail: what a failure quotes."""
_QUOTED = 2000
"""Characters of that output a failure's reason quotes, from its end."""

_WAIT_FOR_PORT = """
import socket, sys, time
port, deadline = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while True:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.05)
"""
"""Inside the sandbox: until something accepts connections on 127.0.0.1:PORT, or exit 3 past
the deadline. A readiness probe: what listens there is the start command's own business, and
nothing outside the sandbox can see the port to wait on it."""


def start_template(sandbox: BaseSandbox, template: TemplateConfig) -> None:
    """Start ``template.start`` in ``sandbox`` as a job, then wait for ``template.ready_port``;
    `SandboxStartError` if it could not start or its port did not open in time."""
    if template.start is None:
        return
    runner = JobRunner(sandbox, keep=8, max_read=_KEPT_OUTPUT)
    try:
        job = runner.start(template.start, output_limit=_KEPT_OUTPUT)
    except JobError as failed:
        raise SandboxStartError(
            f"start command failed: {failed}", reason=f"the template's start command: {failed}"
        ) from failed
    if template.ready_port is None:
        return
    command = f"python3 -c {shlex.quote(_WAIT_FOR_PORT)} {template.ready_port} {template.ready_timeout}"
    waited = sandbox.execute(command, timeout=template.ready_timeout + 10)
    if waited.exit_code == 0:
        return
    try:
        output = runner.poll(job.id).response().output
    except JobError as failed:
        output = f"(its output could not be read: {failed})"
    why = (
        f"the template's start command did not listen on port {template.ready_port} within "
        f"{template.ready_timeout:g}s; its output ends: {output[-_QUOTED:]!r}"
    )
    raise SandboxStartError(why, reason=why)
