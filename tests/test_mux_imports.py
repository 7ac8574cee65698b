"""The exec helper's two sides import without cycles, and the side that runs in a sandbox
(`sandboxes._helper`) imports nothing of the host's: it is shipped alone."""

from __future__ import annotations

import functools

import grimp

_SIDES = ("sandboxes._helper", "sandboxes._mux")


@functools.cache
def _graph() -> grimp.ImportGraph:
    """Every import of `sandboxes`, those made only for type checking included."""
    return grimp.build_graph("sandboxes", cache_dir=None)


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[str]:
    """Each direct import ``a -> b`` among ``modules`` whose ``b`` leads back to ``a``."""
    found = []
    for importer in sorted(modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & modules):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                found.append(" -> ".join((importer, *back)))
    return found


def _modules(graph: grimp.ImportGraph, package: str) -> set[str]:
    return {package, *graph.find_descendants(package)}


def test_the_helper_and_its_client_have_no_import_cycle() -> None:
    graph = _graph()
    modules = set().union(*(_modules(graph, side) for side in _SIDES))
    assert len(modules) > 20
    assert _cycles(graph, modules) == []


def test_a_cycle_is_caught() -> None:
    """The check above can fail: an import back from `_frames` to the client is a cycle."""
    graph = grimp.build_graph("sandboxes", cache_dir=None)
    graph.add_import(importer="sandboxes._mux._frames", imported="sandboxes._mux.client")
    assert any("sandboxes._mux._frames" in cycle for cycle in _cycles(graph, _modules(graph, "sandboxes._mux")))


def test_the_helper_imports_nothing_of_the_host() -> None:
    graph = _graph()
    helper = _modules(graph, "sandboxes._helper")
    outside = {
        f"{module} -> {imported}"
        for module in helper
        for imported in graph.find_modules_directly_imported_by(module)
        if imported not in helper
    }
    assert outside == set()
