"""Deprecated: `sandboxes.docker` holds the Docker provider now; this re-export goes next release."""

from sandboxes.docker._containers import create_container, remove_sandbox
from sandboxes.docker.provider import DockerProvider, DockerProviderConfig, SweepReport

__all__ = ["DockerProvider", "DockerProviderConfig", "SweepReport", "create_container", "remove_sandbox"]
