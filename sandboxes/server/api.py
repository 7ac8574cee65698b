"""Deprecated location of the wire contract: it moved to `sandboxes.api`.

Kept as a re-export for one release so ``from sandboxes.server.api import ...`` keeps working;
new code imports `sandboxes.api` (the client must, it may not import ``sandboxes.server``).
"""

from __future__ import annotations

from sandboxes.api import *  # noqa: F403
from sandboxes.api import __all__ as __all__
