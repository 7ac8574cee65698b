"""Test support shipped with the package: the backend conformance suite.

Importing this module needs pytest and hypothesis (extra ``testing``)."""

from sandboxes.testing.conformance import BackendConformance
from sandboxes.testing.lifecycle_conformance import LifecycleConformance
from sandboxes.testing.provider_conformance import ProviderConformance, SharedProviderConformance
from sandboxes.testing.sandbox_conformance import SandboxConformance

__all__ = [
    "BackendConformance",
    "LifecycleConformance",
    "ProviderConformance",
    "SandboxConformance",
    "SharedProviderConformance",
]
