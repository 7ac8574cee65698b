"""The seccomp builder's syscall tables agree with the kernel headers, and the program is sane."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from support import needs

from sandboxes.local import _seccomp

HEADERS = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),
}


def _header_numbers(path: Path) -> dict[str, int]:
    needs(path.exists(), f"{path} missing (install linux-libc-dev; .ci/run does)")
    text = path.read_text()
    return {name: int(number) for name, number in re.findall(r"#define __NR3?2?_(\w+)\s+(\d+)\b", text)}


@pytest.mark.parametrize("machine", sorted(HEADERS))
def test_syscall_numbers_match_the_kernel_headers(machine: str) -> None:
    expected = _header_numbers(HEADERS[machine])
    _arch, table = _seccomp.SYSCALLS[machine]
    assert {name: expected.get(name) for name in table} == table
    missing = [name for name in _seccomp.BLOCKED if name in expected and name not in table]
    assert missing == [], f"blocked calls that exist on {machine} but are not in its table"


def test_program_is_whole_instructions_ending_in_allow() -> None:
    program = _seccomp.filter_program("x86_64")
    assert len(program) % 8 == 0
    code, _jt, _jf, k = struct.unpack("=HBBI", program[-8:])
    assert (code, k) == (0x06, 0x7FFF0000)


def test_unknown_architecture_is_refused() -> None:
    with pytest.raises(_seccomp.UnsupportedArchitecture):
        _seccomp.filter_program("mips")
