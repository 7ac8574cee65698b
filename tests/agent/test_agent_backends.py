"""GraphStateBackend and StoreBackend: the reference semantics, kept in graph state or a store."""

from __future__ import annotations

from pathlib import Path

from langgraph.store.memory import InMemoryStore

from agent import GraphStateBackend, StoreBackend, merge_files
from agent.persistence import open_sqlite


def test_merge_files_overrides_and_deletes_path_by_path() -> None:
    a = {"content": "a", "encoding": "utf-8", "created_at": None, "modified_at": None}
    b = {"content": "b", "encoding": "utf-8", "created_at": None, "modified_at": None}
    assert merge_files({"/x": a, "/y": a}, {"/y": b, "/x": None, "/z": b}) == {"/y": b, "/z": b}  # type: ignore[dict-item]
    assert merge_files(None, None) == {}


def test_graph_state_backend_reports_only_what_changed_under_its_prefix() -> None:
    state_backend = GraphStateBackend({}, "/scratch/")
    assert state_backend.write("/a.txt", "one\n").ok
    assert state_backend.write("/dir/b.txt", "two\n").ok
    files = state_backend.changes()
    assert set(files) == {"/scratch/a.txt", "/scratch/dir/b.txt"}

    again = GraphStateBackend(merge_files(None, files) | {"/elsewhere.txt": files["/scratch/a.txt"]}, "/scratch")  # type: ignore[arg-type]
    assert again.ls("/").entries is not None
    assert [e.path for e in again.ls("/").entries or []] == ["/a.txt", "/dir/"]
    assert again.changes() == {}
    assert again.edit("/a.txt", "one", "uno").ok
    assert again.delete("/dir").ok
    changes = again.changes()
    assert set(changes) == {"/scratch/a.txt", "/scratch/dir/b.txt"}
    assert changes["/scratch/dir/b.txt"] is None
    assert changes["/scratch/a.txt"]["content"] == "uno\n"  # type: ignore[index]
    assert again.read("/missing").error == "file_not_found"
    assert again.changes() == changes


def test_binary_content_survives_the_state_round_trip() -> None:
    first = GraphStateBackend({}, "/scratch/")
    [response] = first.upload_files([("/blob.bin", b"\x00\xff\x10")])
    assert response.error is None
    second = GraphStateBackend(first.changes(), "/scratch/")  # type: ignore[arg-type]
    [download] = second.download_files(["/blob.bin"])
    assert download.content == b"\x00\xff\x10"


def test_store_backend_writes_through_and_is_seen_by_a_new_instance() -> None:
    store = InMemoryStore()
    first = StoreBackend(store, ("user-1", "memories"))
    assert first.write("/notes.md", "hello\n").ok
    assert first.edit("/notes.md", "hello", "bye").ok
    assert StoreBackend(store, ("user-1", "memories")).read("/notes.md").file_data.content == "bye\n"  # type: ignore[union-attr]
    assert StoreBackend(store, ("user-2", "memories")).read("/notes.md").error == "file_not_found"
    assert first.delete("/notes.md").ok
    assert store.search(("user-1", "memories")) == []


def test_store_backend_on_sqlite_outlives_the_connection(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite"
    with open_sqlite(db) as persistence:
        backend = StoreBackend(persistence.store)
        for i in range(1200):  # more than one page of the store's search
            assert backend.write(f"/many/{i}.txt", str(i)).ok
    with open_sqlite(db) as persistence:
        backend = StoreBackend(persistence.store)
        assert backend.read("/many/1199.txt").file_data.content == "1199"  # type: ignore[union-attr]
        assert len(backend.glob("*.txt", "/many").matches or []) == 1200
        grep = backend.grep("1199", "/many")
        assert [m.path for m in grep.matches or []] == ["/many/1199.txt"]
