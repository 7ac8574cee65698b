"""Answers the conformance suites read, each checked to carry no error on the way."""

from __future__ import annotations

from sandboxes import protocol as p

__all__ = ["grep_matches", "listed_entries", "whole_text"]


def whole_text(backend: p.BackendProtocol, path: str) -> str:
    """The file's whole text via download (read paginates and normalises line endings)."""
    [response] = backend.download_files([path])
    assert response.error is None, response
    assert response.content is not None
    return response.content.decode("utf-8")


def listed_entries(backend: p.BackendProtocol, path: str) -> list[p.FileInfo]:
    result = backend.ls(path)
    assert result.error is None, result
    assert result.entries is not None
    return result.entries


def grep_matches(result: p.GrepResult) -> list[p.GrepMatch]:
    assert result.error is None, result
    assert result.matches is not None
    return result.matches
