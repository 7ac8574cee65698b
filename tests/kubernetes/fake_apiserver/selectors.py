"""Label and field selectors, parsed as the FAKE API server's real counterpart does (a subset)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .store import ApiError

__all__ = ["field_selector", "label_selector"]

Predicate = Callable[[dict[str, Any]], bool]
_SET = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ = re.compile(r"^\s*([\w./-]+)\s*(==|!=|=)\s*([\w.-]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([\w./-]+)\s*$")


def _split(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p for p in parts if p.strip()]


def _requirement(text: str) -> Callable[[dict[str, str]], bool]:
    if m := _SET.match(text):
        key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if m := _EQ.match(text):
        key, op, value = m.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: key in labels and labels[key] == value
    if m := _EXISTS.match(text):
        negate, key = m.group(1) == "!", m.group(2)
        return lambda labels: (key in labels) != negate
    raise ApiError(400, "BadRequest", f"unable to parse requirement: {text.strip()!r}")


def label_selector(selector: str | None) -> Predicate:
    requirements = [_requirement(part) for part in _split(selector or "")]
    return lambda obj: all(r(obj["metadata"].get("labels") or {}) for r in requirements)


_FIELDS: dict[str, Callable[[dict[str, Any]], str]] = {
    "metadata.name": lambda o: o["metadata"]["name"],
    "metadata.namespace": lambda o: o["metadata"]["namespace"],
    "status.phase": lambda o: o.get("status", {}).get("phase", ""),
    "spec.nodeName": lambda o: o["spec"].get("nodeName", ""),
}


def field_selector(selector: str | None) -> Predicate:
    checks: list[Predicate] = []
    for part in _split(selector or ""):
        m = _EQ.match(part)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid selector: {part!r}")
        field, op, value = m.groups()
        if field not in _FIELDS:
            raise ApiError(400, "BadRequest", f'field label not supported: "{field}"')
        checks.append(_field_check(_FIELDS[field], op == "!=", value))
    return lambda obj: all(c(obj) for c in checks)


def _field_check(get: Callable[[dict[str, Any]], str], negate: bool, value: str) -> Predicate:
    return lambda obj: (get(obj) == value) != negate
