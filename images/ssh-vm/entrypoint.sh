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

# The pool users (group `sandboxes`) get no network at all, loopback included: sandboxes sharing
# this VM must not reach each other's servers, the VM's own services, or the outside. An
# owner-match rule rejects every socket they send from; it needs CAP_NET_ADMIN (for a container:
# --cap-add NET_ADMIN). Without it the VM refuses to start, unless SANDBOXES_POOL_NETWORK=allow
# says the operator accepts that sandboxes here share one network.
if [ "${SANDBOXES_POOL_NETWORK:-deny}" != allow ]; then
    for table in iptables ip6tables; do
        rule="OUTPUT -m owner --gid-owner sandboxes --suppl-groups -j REJECT"
        # shellcheck disable=SC2086  # the rule is a list of words on purpose
        $table -C $rule 2>/dev/null || $table -I $rule || {
            echo "sandboxes-sshd: cannot firewall the sandbox users ($table): run with CAP_NET_ADMIN," \
                "or set SANDBOXES_POOL_NETWORK=allow to let sandboxes on this VM share its network" >&2
            exit 1
        }
    done
fi

# Per-container host keys (ssh-keygen -A only creates the missing ones).
ssh-keygen -A

# Privilege separation directory; /run may be a fresh tmpfs.
install -d -m 0755 /run/sshd
# -D: stay in the foreground (sshd is the container's PID 1); -e: log to stderr, i.e. `docker logs`.
exec /usr/sbin/sshd -D -e "$@"
