"""The local backend: `LocalSandbox`, commands in a bubblewrap jail on this host.

Its private plumbing lives beside it: the jail's mounts (`_jail`), its seccomp filter
(`_seccomp`), cgroup and rlimit limits (`_limits`), the long-lived jail running the exec helper
(`_helper`), the one-process-per-command fallback (`_process`) and tree removal (`_tree`);
`provider` makes sandboxes as directories under one base directory."""

from sandboxes.local.provider import LocalProvider, LocalProviderConfig
from sandboxes.local.sandbox import LocalSandbox, LocalSandboxConfig, LocalSandboxTemplate
from sandboxes.local.template import LocalTemplate
from sandboxes.protocol import NotIsolatedWarning

__all__ = [
    "LocalProvider",
    "LocalProviderConfig",
    "LocalSandbox",
    "LocalSandboxConfig",
    "LocalSandboxTemplate",
    "LocalTemplate",
    "NotIsolatedWarning",
]
