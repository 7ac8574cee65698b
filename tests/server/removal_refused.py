"""The service (`sandboxes.server.__main__.serve`) with every removal refused by its backend,
run as a script with the service's arguments: the Docker engine's 500 "unable to remove
filesystem" to every container removal (raised where the client makes the call), an `OSError` to
every local sandbox's. For the tests of a deletion whose destroy keeps failing until the service
is killed (`test_service_deleted`), which inject the same refusals in-process."""

from __future__ import annotations

import sys
from typing import Any

import docker.errors


def refused_removal(self: Any, **kwargs: Any) -> None:
    """What the engine answers a removal it cannot complete (a busy mount, a dying runtime)."""
    raise docker.errors.APIError("500 Server Error: Internal Server Error", explanation="unable to remove filesystem")


def refused_local_removal(self: Any, ref: str) -> None:
    raise OSError(16, "Device or resource busy (injected)", ref)


def main() -> int:
    import docker.models.containers

    from sandboxes.local.provider import LocalProvider
    from sandboxes.server.__main__ import serve

    docker.models.containers.Container.remove = refused_removal
    LocalProvider.destroy = refused_local_removal  # type: ignore[method-assign]
    return serve()


if __name__ == "__main__":
    sys.exit(main())
