"""Docker and Kubernetes read a sandbox's expiry label alike (`sandboxes.lifecycle.label_expiry`):
a number is the expiry; no label, or one that reads as no number (a label is not ours alone to
write), is no expiry, the latter said in the backend's own log. No engine or cluster needed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from sandboxes.docker import LABEL_EXPIRES as DOCKER_EXPIRES
from sandboxes.docker._containers import recorded_expiry
from sandboxes.kubernetes import LABEL_EXPIRES as POD_EXPIRES
from sandboxes.kubernetes._pods import pod_record


def _container_expiry(labels: dict[str, str]) -> float | None:
    return recorded_expiry({"Names": ["/sandboxes-abc"], "Labels": labels})


def _pod_expiry(labels: dict[str, str]) -> float | None:
    metadata = SimpleNamespace(name="sandbox-abc", labels=labels, creation_timestamp=None)
    return pod_record(SimpleNamespace(metadata=metadata, status=None)).expires_at


@pytest.mark.parametrize(
    ("read", "label", "log"),
    [
        (_container_expiry, DOCKER_EXPIRES, "sandboxes.docker._containers"),
        (_pod_expiry, POD_EXPIRES, "sandboxes.kubernetes._pods"),
    ],
    ids=["docker", "kubernetes"],
)
def test_an_expiry_label_reads_as_its_number_and_an_unreadable_one_as_none(
    read: Callable[[dict[str, str]], float | None], label: str, log: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert read({label: "1800000000.5"}) == 1800000000.5
    assert read({}) is None
    assert caplog.records == []
    with caplog.at_level(logging.WARNING, logger=log):
        assert read({label: "soon"}) is None
    assert [(record.name, record.getMessage()) for record in caplog.records] == [
        (log, f"ignoring unreadable {label} label 'soon'")
    ]
