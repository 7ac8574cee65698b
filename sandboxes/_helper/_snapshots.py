"""The file watch's fallback where inotify is missing (no ctypes, no ``inotify_init1``, no
instance left): the watched tree's snapshots, taken with ``scandir`` and bounded in entries,
and the events that turn one snapshot into the next, of the kinds inotify gives (`_watch`).
Stdlib only, Python 3.6-compatible.
"""

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    Entry = tuple[int, bool, int, int, int, int, int, int]  # ino, dir, mtime, size, mode, uid, gid, ctime
    Snapshot = dict[str, Entry]  # path relative to the root -> what it was


def snapshot(root: str, recursive: bool, max_entries: int) -> "tuple[Snapshot, bool]":
    """(every entry under ``root`` by its path relative to it, whether the tree had more than
    ``max_entries`` entries and the rest was left out). Directories are entered breadth first,
    symbolic links never; a directory that cannot be listed (its permissions, or gone meanwhile)
    shows its entry without its contents, as it would to the user listing it."""
    entries: "Snapshot" = {}
    pending = [""]
    while pending:
        rel = pending.pop(0)
        try:
            listing = os.scandir(os.path.join(root, rel) if rel else root)
        except OSError:
            continue
        with listing:
            for entry in listing:
                if len(entries) >= max_entries:
                    return entries, True
                name = rel + "/" + entry.name if rel else entry.name
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:  # removed between the listing and the stat
                    continue
                is_dir = stat.S_ISDIR(info.st_mode)
                entries[name] = (
                    info.st_ino,
                    is_dir,
                    info.st_mtime_ns,
                    info.st_size,
                    info.st_mode,
                    info.st_uid,
                    info.st_gid,
                    info.st_ctime_ns,
                )
                if is_dir and recursive:
                    pending.append(name)
    return entries, False


def changes(old: "Snapshot", new: "Snapshot") -> "list[tuple[str, str]]":
    """[(kind, path)] that turn ``old`` into ``new``, as inotify names them: a path that appeared
    is a ``create``, one that went a ``remove``, unless an inode that went reappeared under
    another path (a ``rename`` of the old path, then a ``create`` of the new, as inotify
    reports a move); a file whose content changed (mtime or size) a ``write``; an entry whose
    mode, owner or other metadata changed a ``chmod`` (for a directory, its mode or owner: its
    times change with its entries). Linear in the snapshots' sizes."""
    gone: "dict[int, str]" = {}  # ino -> path, of the paths that went
    for path, entry in old.items():
        if path not in new:
            gone[entry[0]] = path
    events: "list[tuple[str, str]]" = []
    moved: "set[str]" = set()
    for path, entry in new.items():
        before = old.get(path)
        if before is None:
            source = gone.get(entry[0])
            if source is not None and source not in moved and old[source][1] == entry[1]:
                moved.add(source)
                events.append(("rename", source))
            events.append(("create", path))
        elif before[0] != entry[0]:  # replaced by another inode (a rename over it, say)
            events.append(("create", path))
        elif not entry[1] and (before[2] != entry[2] or before[3] != entry[3]):
            events.append(("write", path))
        elif before[4:7] != entry[4:7] or (not entry[1] and before[7] != entry[7]):
            events.append(("chmod", path))
    for path in old:
        if path not in new and path not in moved:
            events.append(("remove", path))
    return events
