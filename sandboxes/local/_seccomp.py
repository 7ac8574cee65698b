"""A seccomp filter for the local jail, compiled to the classic BPF that ``bwrap --seccomp`` loads.

Why a builder here rather than libseccomp: its Python binding is a distribution package
(Debian's ``python3-seccomp``) that a virtualenv cannot install, and the filter we need is a
plain deny list, which is a few lines of BPF: check the architecture, load the syscall number,
answer ``EPERM`` for every listed call, allow the rest. The deny list is the part of Docker's
default profile that matters for an unprivileged process (kernel modules, mounts, keyrings,
BPF, perf, ptrace and cross-process memory access, io_uring, time, swap, reboot, namespaces),
so a kernel bug reachable only through one of them is out of reach of the sandbox.

Syscall numbers differ per architecture; the tables below are checked against the kernel
headers by ``tests/test_seccomp.py``. On an architecture without a table the sandbox refuses
to start rather than run unfiltered (``LocalSandboxConfig.seccomp=False`` to accept that).
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["BLOCKED", "SYSCALLS", "UnsupportedArchitecture", "filter_program"]

BLOCKED = (
    "acct",
    "add_key",
    "adjtimex",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "init_module",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "migrate_pages",
    "modify_ldt",
    "mount",
    "mount_setattr",
    "move_mount",
    "move_pages",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pidfd_getfd",
    "pivot_root",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "quotactl",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "swapoff",
    "swapon",
    "syslog",
    "umount2",
    "unshare",
    "userfaultfd",
    "uselib",
    "vhangup",
)
"""What the sandbox may not call (answered ``EPERM``). ``clone`` with namespace flags is left
to bwrap's ``--disable-userns`` (without a user namespace no other namespace can be made)."""

_X86_64 = {
    "acct": 163, "add_key": 248, "adjtimex": 159, "bpf": 321, "clock_adjtime": 305,
    "clock_settime": 227, "delete_module": 176, "finit_module": 313, "fsconfig": 431,
    "fsmount": 432, "fsopen": 430, "fspick": 433, "init_module": 175, "io_uring_enter": 426,
    "io_uring_register": 427, "io_uring_setup": 425, "ioperm": 173, "iopl": 172, "kcmp": 312,
    "kexec_file_load": 320, "kexec_load": 246, "keyctl": 250, "lookup_dcookie": 212,
    "migrate_pages": 256, "modify_ldt": 154, "mount": 165, "mount_setattr": 442,
    "move_mount": 429, "move_pages": 279, "name_to_handle_at": 303, "nfsservctl": 180,
    "open_by_handle_at": 304, "open_tree": 428, "perf_event_open": 298, "pidfd_getfd": 438,
    "pivot_root": 155, "process_vm_readv": 310, "process_vm_writev": 311, "ptrace": 101,
    "quotactl": 179, "reboot": 169, "request_key": 249, "setns": 308, "settimeofday": 164,
    "swapoff": 168, "swapon": 167, "syslog": 103, "umount2": 166, "unshare": 272,
    "userfaultfd": 323, "uselib": 134, "vhangup": 153,
}  # fmt: skip
_AARCH64 = {  # the generic table (asm-generic/unistd.h); no ioperm, iopl, modify_ldt, uselib
    "acct": 89, "add_key": 217, "adjtimex": 171, "bpf": 280, "clock_adjtime": 266,
    "clock_settime": 112, "delete_module": 106, "finit_module": 273, "fsconfig": 431,
    "fsmount": 432, "fsopen": 430, "fspick": 433, "init_module": 105, "io_uring_enter": 426,
    "io_uring_register": 427, "io_uring_setup": 425, "kcmp": 272, "kexec_file_load": 294,
    "kexec_load": 104, "keyctl": 219, "lookup_dcookie": 18, "migrate_pages": 238,
    "mount": 40, "mount_setattr": 442, "move_mount": 429, "move_pages": 239,
    "name_to_handle_at": 264, "nfsservctl": 42, "open_by_handle_at": 265, "open_tree": 428,
    "perf_event_open": 241, "pidfd_getfd": 438, "pivot_root": 41, "process_vm_readv": 270,
    "process_vm_writev": 271, "ptrace": 117, "quotactl": 60, "reboot": 142, "request_key": 218,
    "setns": 268, "settimeofday": 170, "swapoff": 225, "swapon": 224, "syslog": 116,
    "umount2": 39, "unshare": 97, "userfaultfd": 282, "vhangup": 58,
}  # fmt: skip

SYSCALLS: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, _X86_64),  # AUDIT_ARCH_X86_64
    "aarch64": (0xC00000B7, _AARCH64),  # AUDIT_ARCH_AARCH64
}
"""machine -> (audit architecture, syscall numbers)."""

_X32_SYSCALL_BIT = 0x40000000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_NR_OFFSET = 0  # struct seccomp_data: int nr; __u32 arch; ...
_ARCH_OFFSET = 4


class UnsupportedArchitecture(RuntimeError):
    """No syscall table for this machine, so no filter can be built."""


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)  # struct sock_filter


def filter_program(machine: str | None = None) -> bytes:
    """The filter as ``struct sock_filter[]``: foreign architectures (and the x32 ABI, whose
    numbers would slip past the table) kill the process; listed calls fail with EPERM."""
    machine = machine or platform.machine()
    if machine not in SYSCALLS:
        raise UnsupportedArchitecture(f"no seccomp syscall table for {machine!r}")
    arch, numbers = SYSCALLS[machine]
    program = [
        _op(_LD_W_ABS, _ARCH_OFFSET),
        _op(_JEQ_K, arch, jt=1),
        _op(_RET_K, _RET_KILL_PROCESS),
        _op(_LD_W_ABS, _NR_OFFSET),
    ]
    if machine == "x86_64":
        program += [_op(_JGE_K, _X32_SYSCALL_BIT, jf=1), _op(_RET_K, _RET_KILL_PROCESS)]
    for name in BLOCKED:
        if name in numbers:
            program += [_op(_JEQ_K, numbers[name], jf=1), _op(_RET_K, _RET_ERRNO | errno.EPERM)]
    program.append(_op(_RET_K, _RET_ALLOW))
    return b"".join(program)
