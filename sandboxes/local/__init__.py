"""The local backend: `LocalSandbox`, commands in a bubblewrap jail on this host.

Its private plumbing lives beside it: the jail's mounts (`_jail`), its seccomp filter
(`_seccomp`), cgroup and rlimit limits (`_limits`), the long-lived jail running the exec helper
(`_helper`) and the one-process-per-command fallback (`_process`)."""

from sandboxes.local.sandbox import LocalSandbox, LocalSandboxConfig
from sandboxes.protocol import NotIsolatedWarning

__all__ = ["LocalSandbox", "LocalSandboxConfig", "NotIsolatedWarning"]
