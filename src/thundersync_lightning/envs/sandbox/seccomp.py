"""A seccomp-BPF deny list for sandboxed commands, built here (no libseccomp) and handed to bwrap.

The program (classic BPF, ``struct sock_filter`` = ``u16 code, u8 jt, u8 jf, u32 k``, native
byte order) is::

    A = seccomp_data.arch                  if A != AUDIT_ARCH of this host: KILL_PROCESS
    A = seccomp_data.nr                    (x86_64: nr >= 0x40000000, the x32 ABI: EPERM)
    for nr in DENIED[arch]:                if A == nr: ERRNO(EPERM)
    ALLOW

Invariants: a syscall made through another ABI (i386 ``int 0x80`` on x86_64, x32) never reaches
the number comparisons with a number of the wrong table; every denied syscall fails with EPERM
(never kills, so probing code sees an ordinary error); everything else is allowed, because the
sandbox's other layers (no capabilities, unprivileged uid, no user namespaces, rlimits, cgroups)
already contain it. The list covers the kernel's large attack surfaces an unprivileged process
can still reach (keyrings, io_uring, bpf, perf, userfaultfd, ptrace, cross-process memory) and
everything that changes mounts, namespaces or the machine.

bwrap installs the filter with ``--seccomp FD`` right before it executes the command, after its
own mount and namespace set-up (which needs several of the denied calls).
"""

from __future__ import annotations

import errno
import os
import platform
import struct

from .base import SandboxError

__all__ = ["DENIED_SYSCALLS", "build_filter", "filter_fd", "seccomp_supported"]

# Syscall numbers per architecture (x86_64: asm/unistd_64.h; aarch64: asm-generic/unistd.h).
_NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "keyctl": 250, "add_key": 248, "request_key": 249,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "mount_setattr": 442,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428,
        "unshare": 272, "setns": 308,
        "open_by_handle_at": 304, "name_to_handle_at": 303,
        "swapon": 167, "swapoff": 168, "reboot": 169, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "acct": 163, "quotactl": 179,
        "syslog": 103, "lookup_dcookie": 212, "settimeofday": 164, "clock_settime": 227,
        "clock_adjtime": 305, "adjtimex": 159, "vhangup": 153, "iopl": 172, "ioperm": 173, "uselib": 134,
    },
    "aarch64": {
        "keyctl": 219, "add_key": 217, "request_key": 218,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "ptrace": 117,
        "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "mount_setattr": 442,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428,
        "unshare": 97, "setns": 268,
        "open_by_handle_at": 265, "name_to_handle_at": 264,
        "swapon": 224, "swapoff": 225, "reboot": 142, "kexec_load": 104, "kexec_file_load": 294,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "acct": 89, "quotactl": 60,
        "syslog": 116, "lookup_dcookie": 18, "settimeofday": 170, "clock_settime": 112,
        "clock_adjtime": 266, "adjtimex": 171, "vhangup": 58,
    },
}
DENIED_SYSCALLS: dict[str, frozenset[str]] = {arch: frozenset(t) for arch, t in _NUMBERS.items()}

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT = 0x40000000

# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_OFF_NR, _OFF_ARCH = 0, 4  # offsetof(struct seccomp_data, nr / arch)


def _machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def seccomp_supported(arch: str | None = None) -> bool:
    return (arch or _machine()) in _NUMBERS


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(arch: str | None = None, errno_value: int = errno.EPERM) -> bytes:
    """The raw ``sock_filter`` array for ``arch`` (default: this host's), as bwrap reads it."""
    arch = arch or _machine()
    if arch not in _NUMBERS:
        raise SandboxError(f"no seccomp syscall table for architecture {arch!r} (have: {sorted(_NUMBERS)}); "
                           "pass seccomp=False in BwrapConfig to run without the filter on this host")
    numbers = sorted(set(_NUMBERS[arch].values()))
    deny = _RET_ERRNO | (errno_value & 0xFFFF)
    prog = [_insn(_LD_W_ABS, _OFF_ARCH),
            _insn(_JEQ_K, _AUDIT_ARCH[arch], jt=1, jf=0),
            _insn(_RET_K, _RET_KILL_PROCESS),
            _insn(_LD_W_ABS, _OFF_NR)]
    # Layout after the header: [x32 check] [one JEQ per number] [ALLOW] [DENY].
    n = len(numbers)
    if arch == "x86_64":
        prog.append(_insn(_JGE_K, _X32_SYSCALL_BIT, jt=n + 1, jf=0))
    for i, nr in enumerate(numbers):
        prog.append(_insn(_JEQ_K, nr, jt=n - i, jf=0))  # to DENY: skip the rest and ALLOW
    prog.append(_insn(_RET_K, _RET_ALLOW))
    prog.append(_insn(_RET_K, deny))
    if len(prog) > 4096:  # BPF_MAXINSNS
        raise SandboxError("seccomp program too long")
    return b"".join(prog)


def filter_fd(program: bytes) -> int:
    """A fresh, inheritable memfd holding ``program`` at offset 0 (bwrap reads it to EOF).

    One descriptor per command: a shared one would share its file offset between runs.
    """
    fd = os.memfd_create("tsl-seccomp", 0)  # no MFD_CLOEXEC: bwrap must inherit it
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
