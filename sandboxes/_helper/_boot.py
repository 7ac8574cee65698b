"""The importer of the shipped exec helper: its modules served from their sources, each compiled
when first imported, so the file ops (`_files` and what it imports) cost nothing at the start.

Run in the sandbox's ``__main__`` by the one-line bootstrap of `sandboxes._mux._shipped`, with
the sources unpacked: stdlib only, Python 3.6-compatible, nothing imported but what an
interpreter started with ``-I -S`` has loaded already.
"""

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType


def install(sources: "dict[str, str]", package: str) -> "ModuleType":
    """Serve ``package`` and its modules (``sources``: module name -> source, ``__init__`` the
    package's own) from ``sources``, first on ``sys.meta_path``; answer its `_server` module.
    The finder's ``sources`` is that dict: modules shipped later are added to it."""
    spec_type = sys.modules["_frozen_importlib"].ModuleSpec  # importlib's, loaded in every interpreter

    class Finder:
        shipped = sources

        @classmethod
        def find_spec(
            cls, name: str, path: "Sequence[str] | None" = None, target: "ModuleType | None" = None
        ) -> "ModuleSpec | None":
            short = "__init__" if name == package else name[len(package) + 1 :]
            if name != package and not name.startswith(package + "."):
                return None
            if short not in sources:
                return None
            spec = spec_type(name, cls, is_package=name == package)  # type: ModuleSpec
            return spec

        @staticmethod
        def create_module(spec: "ModuleSpec") -> None:
            return None

        @staticmethod
        def exec_module(module: "ModuleType") -> None:
            name = module.__name__
            short = "__init__" if name == package else name[len(package) + 1 :]
            code = compile(sources[short], "<exec helper>/%s.py" % short, "exec")
            exec(code, module.__dict__)  # noqa: S102 (the helper's own modules, shipped by the host)

    sys.meta_path.insert(0, Finder)
    return __import__(package + "._server", fromlist=["main"])
