#!/bin/sh
# Start sshd in the foreground for the ssh-vm image.
set -eu

# Authorized keys for `sandbox`: $SSH_AUTHORIZED_KEYS and/or a mounted file, read once at start.
keys=/run/sandboxes/authorized_keys/sandbox
install -d -m 0755 /run/sandboxes /run/sandboxes/authorized_keys
{
    if [ -n "${SSH_AUTHORIZED_KEYS:-}" ]; then printf '%s\n' "$SSH_AUTHORIZED_KEYS"; fi
    if [ -r /etc/ssh/authorized_keys/sandbox ]; then cat /etc/ssh/authorized_keys/sandbox; fi
} > "$keys"
chmod 0644 "$keys"
if ! grep -q '[^[:space:]]' "$keys"; then
    echo "sandboxes-sshd: no key for user sandbox: set SSH_AUTHORIZED_KEYS or mount /etc/ssh/authorized_keys/sandbox" >&2
    exit 1
fi
unset SSH_AUTHORIZED_KEYS

# Per-container host keys (ssh-keygen -A only creates the missing ones).
ssh-keygen -A

# Privilege separation directory; /run may be a fresh tmpfs.
install -d -m 0755 /run/sshd
# -D: stay in the foreground (sshd is the container's PID 1); -e: log to stderr, i.e. `docker logs`.
exec /usr/sbin/sshd -D -e "$@"
