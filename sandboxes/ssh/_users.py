"""Per-sandbox users on an SSH host: what keeps sandboxes that share one VM out of each other's files.

Every sandbox on a host would otherwise run as the login user, and a ``chmod 700`` workspace
does not stop a process of the same user. So with ``isolation="user"`` each sandbox runs as
its own OS user, leased for its life from a pool: the members of a group (``sandboxes`` by
default) that the login user may ``sudo -n -u`` to. The ssh-vm image ships 32 of them and the
sudoers rule (``images/ssh-vm``); any VM prepared the same way works.

* A lease is a directory named after the user in the login user's private state directory,
  made with ``mkdir``: atomic on the host, so two clients (or two threads) creating sandboxes
  at once never get the same user. Leases live in the login user's home, so a pool must be
  used through one login user only.
* The workspace is made BY the leased user (mode 700) in a root that is ``0711``: nobody but
  the login user may list it or write in it. It is ``1733`` (sticky) only while a lease makes
  its directories there, under a lock (`_WINDOW`). Beside it, ``.<name>.tmp`` (`tmpdir_of`) is the
  sandbox's private ``TMPDIR`` (hidden, so listings of the root show workspaces only);
  commands run with ``umask 077``, so what they leave in the shared ``/tmp`` is not readable
  by the others either.
* Releasing kills every process of the user, removes every entry the user owns in the root
  (the workspace, its tmp directory and whatever it slipped in while the root was open), the
  user's files in the shared temporary and lock directories, its POSIX message queues, SysV
  IPC objects, cron and at jobs and the contents of its home (`_CLEAN_USER`), and only then
  frees the lease: the next sandbox to get that user inherits nothing. A cleanup that
  fails keeps the lease (the user stays out of the pool) and says why.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from sandboxes import _scripts
from sandboxes.ssh._connection import SSHError

__all__ = [
    "SFTP_SERVER",
    "UserPoolError",
    "WorkspaceNotFound",
    "as_user",
    "lease",
    "make_as",
    "owner",
    "release",
    "remove_as",
    "tmpdir_of",
]

Run = Callable[[str], tuple[int, str]]
"""Runs a command as the login user on the host: its exit status and output."""

_LEASES = "${XDG_STATE_HOME:-$HOME/.local/state}/sandboxes/users"

_WINDOW = r"""open_root() {
  exec 9>>"$leases/root.lock" || return 1
  if command -v flock >/dev/null 2>&1; then flock -w 30 9 || return 1; fi
  chmod 1733 -- "$root"
}
close_root() { chmod 711 -- "$root"; exec 9>&-; }
"""
"""``open_root`` makes the workspace root writable by the pool users while one directory is made
in it, under a lock shared by every lease of the login user; ``close_root`` shuts it again."""

_LEASE = rf"""group=$1; ws=$2; tmp=$3; leases={_LEASES}; root=${{ws%/*}}
mkdir -p -- "$leases" && chmod 700 -- "$leases" && {{ [ -d "$root" ] || mkdir -p -m 711 -- "$root"; }} || exit 10
{_WINDOW}entry=$(getent group "$group") || exit 11
gid=$(printf %s "$entry" | cut -d: -f3)
members="$(printf %s "$entry" | cut -d: -f4 | tr , ' ') $(getent passwd | awk -F: -v g="$gid" '$4 == g {{ print $1 }}')"
for u in $members; do
  mkdir -- "$leases/$u" 2>/dev/null || continue
  printf '%s\n' "$ws" > "$leases/$u/workspace" || {{ rm -rf -- "$leases/$u"; exit 10; }}
  open_root || {{ exec 9>&-; rm -rf -- "$leases/$u"; exit 10; }}
  err=$(sudo -n -u "$u" -- /bin/sh -c 'umask 077; mkdir -- "$1" "$2"' sh "$ws" "$tmp" 2>&1); made=$?
  close_root
  if [ "$made" -eq 0 ]; then printf '%s' "$u"; exit 0; fi
  rm -rf -- "$leases/$u"; printf '%s: %s' "$u" "$err"; exit 12
done
exit 13
"""
"""Lease a free member of group ``$1`` and make workspace ``$2`` as that user; prints the user.
The root is writable by the pool users only while that ``mkdir`` runs."""

_MAKE_AS = rf"""u=$1; ws=$2; leases={_LEASES}; root=${{ws%/*}}
mkdir -p -- "$leases" && chmod 700 -- "$leases" && {{ [ -d "$root" ] || mkdir -p -m 711 -- "$root"; }} || exit 10
{_WINDOW}open_root
err=$(sudo -n -u "$u" -- /bin/sh -c 'umask 077; mkdir -- "$1"' sh "$ws" 2>&1); made=$?
close_root
[ "$made" -eq 0 ] || {{ printf '%s' "$err"; exit 12; }}
"""
"""Make workspace ``$2`` as the one user ``$1`` of ``isolation='none'``, through the same window."""

_REMOVE_AS = r"""u=$1; ws=$2
[ -e "$ws" ] || [ -L "$ws" ] || exit 0
sudo -n -u "$u" -- /bin/sh -c "$3" sh "$ws" 2>&1 || exit 1
rmdir -- "$ws" 2>/dev/null || rm -f -- "$ws" 2>/dev/null || sudo -n -u "$u" -- rm -rf -- "$ws"
"""
"""Remove ``$2``, owned by ``$1``, from a root only the login user may write: the user empties
it (``$3`` is `_EMPTY`), the login user removes the empty entry (the user does, in a root of
someone else's that the user may write)."""

_EMPTY = r"""for p; do
  [ -d "$p" ] && [ ! -L "$p" ] || continue
  find "$p" -type d -exec chmod u+rwx -- '{'} \; 2>/dev/null
  find "$p" -mindepth 1 -delete || exit 1
done
"""
"""Run as the owner of the entries ``$@``: empty each directory among them, whatever its modes
(``'{'}`` is find's ``{}`` hidden from the outer find that passes this script on)."""

_CLEAN_USER = r"""r=0; while kill -9 -1 2>/dev/null && [ "$r" -lt 50 ]; do r=$((r + 1)); sleep 0.02; done
me=$(id -u)
for d in /tmp /var/tmp /dev/shm /run/lock /var/lock /dev/mqueue; do
  [ -d "$d" ] || continue
  find "$d/" -xdev -mindepth 1 -user "$me" -type d -exec chmod u+rwx -- {} \; 2>/dev/null
  find "$d/" -xdev -mindepth 1 -user "$me" -delete 2>/dev/null
done
for kind in shm:m:8:10 msg:q:8:10 sem:s:5:7; do
  t=${kind%%:*}; rest=${kind#*:}; flag=${rest%%:*}; cols=${rest#*:}
  [ -r "/proc/sysvipc/$t" ] || continue
  ids=$(awk -v me="$me" -v u="${cols%:*}" -v c="${cols#*:}" \
    'NR > 1 && ($u == me || $c == me) { print $2 }' "/proc/sysvipc/$t")
  for id in $ids; do ipcrm "-$flag" "$id" 2>/dev/null; done
done
if command -v crontab >/dev/null 2>&1; then crontab -r 2>/dev/null; fi
if command -v atq >/dev/null 2>&1; then
  for j in $(atq 2>/dev/null | awk '{ print $1 }'); do atrm "$j" 2>/dev/null; done
fi
case $HOME in /* ) [ "$HOME" != / ] && [ -O "$HOME" ] || exit 0 ;; * ) exit 0 ;; esac
find "$HOME" -mindepth 1 -type d -exec chmod u+rwx -- {} \; 2>/dev/null
find "$HOME" -mindepth 1 -delete
exit 0
"""
"""Run as the leased user: kill all its processes, then remove everything it may have left for
the next holder of the user: its files in the shared temporary and lock directories and POSIX
message queues; its SysV shared memory, queues and semaphores; its cron and at jobs (where the
host has them); the contents of its home."""

_RELEASE = rf"""u=$1; ws=$2; leases={_LEASES}; root=${{ws%/*}}
[ -d "$leases/$u" ] || exit 0
[ "$(cat -- "$leases/$u/workspace" 2>/dev/null)" = "$ws" ] || exit 14
sudo -n -u "$u" -- /bin/sh -c "$3" sh 2>&1 || exit 15
if [ -d "$root" ]; then
  find "$root/" -mindepth 1 -maxdepth 1 -user "$u" -exec sudo -n -u "$u" -- /bin/sh -c "$4" sh {{}} + 2>&1 || exit 15
  find "$root/" -mindepth 1 -maxdepth 1 -user "$u" \
    -exec /bin/sh -c 'for p; do rmdir -- "$p" 2>/dev/null || rm -f -- "$p"; done' sh {{}} + || exit 15
  left=$(find "$root/" -mindepth 1 -maxdepth 1 -user "$u" -print)
  [ -z "$left" ] || {{ printf 'entries of %s are left in %s: %s' "$u" "$root" "$left"; exit 15; }}
fi
rm -rf -- "$leases/$u"
"""
"""Empty and free the lease of user ``$1`` on workspace ``$2`` (``$3`` is `_CLEAN_USER`, ``$4``
`_EMPTY`): after the user's own cleanup, every entry it owns in the workspace root (its
workspace, its TMPDIR and anything it made there) is emptied by it and removed by the login
user. A lease already gone is fine (idempotent); a lease now held for another workspace is left
alone (14). ``kill -1`` from the user's own shell reaches every process of the user but that
shell (and never sudo, which runs as root)."""

_OWNER = rf"""ws=$1; leases={_LEASES}
u=$(stat -c %U -- "$ws") || exit 16
[ "$(cat -- "$leases/$u/workspace" 2>/dev/null)" = "$ws" ] || exit 14
printf '%s' "$u"
"""
"""The leased user of an existing workspace, checked against its lease."""

SFTP_SERVER = r"""umask 077
for p in /usr/lib/openssh/sftp-server /usr/libexec/openssh/sftp-server /usr/lib/ssh/sftp-server \
         /usr/libexec/sftp-server /usr/lib/sftp-server; do
  [ -x "$p" ] && exec "$p"
done
echo "no sftp-server on this host" >&2; exit 127
"""
"""An SFTP server running as the sandbox's user: the SFTP subsystem would run as the login user,
who cannot enter a leased user's workspace."""


class UserPoolError(SSHError):
    """The host's pool of sandbox users cannot give or take back a user."""


class WorkspaceNotFound(UserPoolError, LookupError):
    """No leased workspace by that path on the host: never made, or destroyed already."""


def tmpdir_of(workspace: str) -> str:
    """The private TMPDIR of an isolated sandbox: hidden beside its workspace."""
    parent, _, name = workspace.rpartition("/")
    return f"{parent}/.{name}.tmp"


def as_user(command: str, user: str, tmpdir: str | None) -> str:
    """``command`` run as ``user`` through sudo (a private umask and TMPDIR when isolated)."""
    prelude = "" if tmpdir is None else f"umask 077; TMPDIR={shlex.quote(tmpdir)}; export TMPDIR; "
    return f"sudo -n -u {shlex.quote(user)} -- /bin/sh -c {shlex.quote(prelude + command)}"


def lease(run: Run, *, host: str, group: str, workspace: str) -> str:
    """Lease a free user of ``group`` and make ``workspace`` as it; the user's name."""
    status, output = run(_scripts.command(_LEASE, group, workspace, tmpdir_of(workspace)))
    if status != 0:
        raise _error(status, _message(status, output, host=host, group=group, workspace=workspace))
    return output


def release(run: Run, *, host: str, user: str, workspace: str) -> None:
    """Empty ``user`` of everything the sandbox left and free its lease (idempotent)."""
    status, output = run(_scripts.command(_RELEASE, user, workspace, _CLEAN_USER, _EMPTY))
    if status != 0:
        raise _error(status, _message(status, output, host=host, group="", workspace=workspace))


def make_as(run: Run, *, host: str, user: str, workspace: str) -> None:
    """Make ``workspace`` as ``user`` (the one user of ``isolation='none'``) in the shut root."""
    status, output = run(_scripts.command(_MAKE_AS, user, workspace))
    if status != 0:
        raise UserPoolError(_message(status, output, host=host, group="", workspace=workspace))


def remove_as(user: str, workspace: str) -> str:
    """The command that removes ``workspace`` of ``user`` from the shut root (idempotent)."""
    return _scripts.command(_REMOVE_AS, user, workspace, _EMPTY)


def owner(run: Run, *, host: str, workspace: str) -> str:
    """The user leased for an existing ``workspace``."""
    status, output = run(_scripts.command(_OWNER, workspace))
    if status != 0:
        raise _error(status, _message(status, output, host=host, group="", workspace=workspace))
    return output


def _error(status: int, message: str) -> UserPoolError:
    return WorkspaceNotFound(message) if status == 16 else UserPoolError(message)


def _message(status: int, output: str, *, host: str, group: str, workspace: str) -> str:
    detail = output.strip()[:500]
    messages = {
        10: f"cannot prepare the workspace root or the lease directory on {host}: {detail}",
        11: f"no group {group!r} on {host}: prepare the VM with per-sandbox users (see images/ssh-vm) "
        "or use isolation='none', under which sandboxes on one host can read each other's files",
        12: f"cannot make workspace {workspace} as a sandbox user on {host} (is the sudoers rule there, "
        f"and are the root's parents searchable by group {group!r}?): {detail}",
        13: f"every user of group {group!r} on {host} is leased to a live sandbox: destroy some, or add users",
        14: f"workspace {workspace} on {host} is not leased to its owner (already released?)",
        15: f"could not clean up the sandbox user of {workspace} on {host}; its lease is kept: {detail}",
        16: f"no workspace {workspace} on {host}",
    }
    return messages.get(status, f"the sandbox user pool on {host} failed ({status}): {detail}")
