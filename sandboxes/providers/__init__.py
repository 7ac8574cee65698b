"""Deprecated home of the providers, kept as a thin re-export for one release: import
`DockerProvider` from `sandboxes.docker` and `SSHProvider` from `sandboxes.ssh`."""
