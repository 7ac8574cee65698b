"""The Docker backend: `DockerSandbox` (one container), `DockerProvider` (templates, a warm
pool, label sweeps) and their config.

Imports run one way inside the package: `config` < `_containers` (create/remove with the
secure defaults) < `sandbox` < `provider`; `_io` is the Docker stream and tar plumbing."""

from sandboxes.docker.config import (
    LABEL_EXPIRES,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_SANDBOX,
    DockerSandboxConfig,
    parse_size,
)
from sandboxes.docker.provider import DockerProvider, DockerProviderConfig, SweepReport
from sandboxes.docker.sandbox import BULK_THRESHOLD, DockerSandbox
from sandboxes.docker.template import DockerTemplate

__all__ = [
    "BULK_THRESHOLD",
    "LABEL_EXPIRES",
    "LABEL_MANAGED",
    "LABEL_OWNER",
    "LABEL_SANDBOX",
    "DockerProvider",
    "DockerProviderConfig",
    "DockerSandbox",
    "DockerSandboxConfig",
    "DockerTemplate",
    "SweepReport",
    "parse_size",
]
