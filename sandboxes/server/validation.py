"""What a creation request may carry: environment variables and labels that every backend
accepts as they are recorded (container labels, pod labels), and an egress allow-list its
template can serve, refused otherwise with a clear ``invalid_request`` rather than a backend's
error."""

from __future__ import annotations

import re

from sandboxes.server.backends import LABEL_USER_PREFIX
from sandboxes.server.egress.policy import parse_rule
from sandboxes.server.errors import ServiceError
from sandboxes.server.settings import LABEL_VALUE
from sandboxes.templates import Template

__all__ = ["check_egress", "check_env", "check_labels"]


def check_env(env: dict[str, str]) -> None:
    for name, value in env.items():
        if not name or "=" in name or "\x00" in name or "\x00" in value:
            raise ServiceError("invalid_request", f"invalid environment variable {name!r}")


_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def check_labels(labels: dict[str, str], *, pod_labels: bool = False) -> None:
    """Labels travel as container labels: keep them to names every backend accepts. On pods
    (``pod_labels``) they are Kubernetes labels: the prefixed key and the value at most 63
    characters, the value of label characters."""
    if len(labels) > 64:
        raise ServiceError("invalid_request", "at most 64 labels")
    for key, value in labels.items():
        if not _LABEL_KEY.match(key) or len(value) > 1024 or "\x00" in value:
            raise ServiceError("invalid_request", f"invalid label {key!r} (name: [A-Za-z0-9._-], 63 max; value: 1 KiB)")
        if pod_labels and (len(LABEL_USER_PREFIX + key) > 63 or not LABEL_VALUE.match(value)):
            longest = 63 - len(LABEL_USER_PREFIX)
            raise ServiceError(
                "invalid_request",
                f"invalid label {key!r} for a pod (name: {longest} characters max; value: 63 max, "
                "[A-Za-z0-9._-], starting and ending alphanumeric)",
            )


def check_egress(name: str, template: Template, allow: list[str] | None) -> None:
    """A create's own allow-list: every rule parses (422), and a non-empty list only on a
    template with egress (409: nothing would serve it)."""
    if allow is None:
        return
    for text in allow:
        try:
            parse_rule(text)
        except ValueError as exc:
            raise ServiceError("invalid_request", f"egress_allow: {exc}") from exc
    if allow and not template.egress:
        message = f"template {name!r} has no egress: a sandbox of it reaches nothing, whatever its allow-list"
        raise ServiceError("invalid_request", message, status=409)
