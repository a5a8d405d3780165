"""A seccomp-BPF filter for sandboxed commands, built here (no libseccomp) and handed to bwrap.

The program (classic BPF, ``struct sock_filter`` = ``u16 code, u8 jt, u8 jf, u32 k``, native
byte order) is::

    A = seccomp_data.arch                  if A != AUDIT_ARCH of this host: KILL_PROCESS
    A = seccomp_data.nr                    (x86_64: nr >= 0x40000000, the x32 ABI: EPERM)
    if A in (socket, socketpair):          A = low 32 bits of args[0] (the family, an ``int``)
                                           if A in ALLOWED_FAMILIES: ALLOW else ERRNO(EAFNOSUPPORT)
    if A == madvise:                       A = low 32 bits of args[2] (the advice, an ``int``)
                                           if A in DENIED_ADVICE: ERRNO(EPERM) else ALLOW
    if A in (preadv2, pwritev2):           ERRNO(ENOSYS)
    for nr in DENIED[arch]:                if A == nr: ERRNO(EPERM)
    ALLOW

Invariants: a syscall made through another ABI (i386 ``int 0x80`` on x86_64, x32) never reaches
the number comparisons with a number of the wrong table (so i386's ``socketcall``, which would
hide the family in memory the filter cannot read, never runs); every denied syscall fails with
EPERM, every refused socket family with EAFNOSUPPORT (never a kill, so probing code sees an
ordinary error); everything else is allowed, because the sandbox's other layers (no
capabilities, unprivileged uid, no user namespaces, rlimits, cgroups) already contain it. The
list covers the kernel's large attack surfaces an unprivileged process can still reach (keyrings,
io_uring, bpf, perf, userfaultfd, ptrace, cross-process memory and descriptors, the x86 LDT) and
everything that changes mounts, namespaces or the machine.

The page cache of the shared read-only binds (``/usr``): a sandbox that can evict a page of a
shared file and another that can tell whether it is cached share a reusable channel. Eviction by
an unprivileged process goes through ``fadvise64`` (``POSIX_FADV_DONTNEED``), ``madvise`` with
``MADV_PAGEOUT`` / ``MADV_COLD`` (on a mapping of the file) and ``process_madvise`` (the same on
its own pidfd); a probe that needs no clock through ``cachestat`` and ``preadv2(RWF_NOWAIT)``
(``EAGAIN`` when the range is not cached). The first four fail with EPERM (``madvise`` only for
those two advices: every other advice is an allocator's everyday call); ``preadv2`` / ``pwritev2``
fail with ENOSYS, on which glibc falls back to ``preadv`` / ``pwritev`` when no flag is given, so
only the flags go. ``mincore`` reports nothing for files the caller cannot write (Linux >= 5.0).
What remains (a timed first read of a page nobody has read, one bit per cold page and no reuse)
is measured in ``benchmarks/page_cache_channel.py``.

Socket families: the network namespace (``--unshare-net``) empties only the families the kernel
namespaces; others (AF_VSOCK on a virtual machine, AF_BLUETOOTH, AF_CAN, ...) reach the host's
devices whatever the namespace. Only AF_UNIX (whose filesystem names live in the sandbox's own
directories, and whose abstract names are per network namespace) and AF_INET / AF_INET6 (the
namespace's own loopback, nothing else) are allowed; the comparison is on the low 32 bits, which
is all the kernel reads of the ``int`` argument.

bwrap installs the filter with ``--seccomp FD`` right before it executes the command, after its
own mount and namespace set-up (which needs several of the denied calls).
"""

from __future__ import annotations

import errno
import os
import platform
import struct
import sys

from .base import SandboxError

__all__ = [
    "ALLOWED_FAMILIES",
    "DENIED_ADVICE",
    "DENIED_SYSCALLS",
    "build_filter",
    "filter_fd",
    "seccomp_supported",
]

# Syscall numbers per architecture (x86_64: asm/unistd_64.h; aarch64: asm-generic/unistd.h).
_NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "kcmp": 312,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "chroot": 161,
        "mount_setattr": 442,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "move_mount": 429,
        "open_tree": 428,
        "unshare": 272,
        "setns": 308,
        "open_by_handle_at": 304,
        "name_to_handle_at": 303,
        "swapon": 167,
        "swapoff": 168,
        "reboot": 169,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "acct": 163,
        "quotactl": 179,
        "syslog": 103,
        "lookup_dcookie": 212,
        "settimeofday": 164,
        "clock_settime": 227,
        "clock_adjtime": 305,
        "adjtimex": 159,
        "vhangup": 153,
        "iopl": 172,
        "ioperm": 173,
        "uselib": 134,
        "pidfd_getfd": 438,
        "modify_ldt": 154,
        "fadvise64": 221,
        "process_madvise": 440,
        "cachestat": 451,
    },
    "aarch64": {
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "kcmp": 272,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "chroot": 51,
        "mount_setattr": 442,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "move_mount": 429,
        "open_tree": 428,
        "unshare": 97,
        "setns": 268,
        "open_by_handle_at": 265,
        "name_to_handle_at": 264,
        "swapon": 224,
        "swapoff": 225,
        "reboot": 142,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "acct": 89,
        "quotactl": 60,
        "syslog": 116,
        "lookup_dcookie": 18,
        "settimeofday": 170,
        "clock_settime": 112,
        "clock_adjtime": 266,
        "adjtimex": 171,
        "vhangup": 58,
        "pidfd_getfd": 438,
        "fadvise64_64": 223,
        "process_madvise": 440,
        "cachestat": 451,
    },
}
DENIED_SYSCALLS: dict[str, frozenset[str]] = {arch: frozenset(t) for arch, t in _NUMBERS.items()}
# socket(2) and socketpair(2): their first argument is checked against ALLOWED_FAMILIES.
_SOCKET_CALLS = {"x86_64": (41, 53), "aarch64": (198, 199)}
ALLOWED_FAMILIES: dict[str, int] = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10}
# madvise(2): its third argument is checked against DENIED_ADVICE (they push file pages out of the cache).
_MADVISE = {"x86_64": 28, "aarch64": 233}
DENIED_ADVICE: dict[str, int] = {"MADV_COLD": 20, "MADV_PAGEOUT": 21}
# preadv2(2), pwritev2(2): ENOSYS (their RWF_NOWAIT flag probes the page cache;
# glibc falls back without flags).
_ENOSYS_CALLS = {"x86_64": (327, 328), "aarch64": (286, 287)}

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
# offsetof(struct seccomp_data, args[0]) is 16; its low 32 bits sit there on little-endian hosts.
_OFF_ARG0_LOW = 16 if sys.byteorder == "little" else 20
_OFF_ARG2_LOW = _OFF_ARG0_LOW + 16  # args[2]: two 8-byte arguments further


def _machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def seccomp_supported(arch: str | None = None) -> bool:
    return (arch or _machine()) in _NUMBERS


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _assemble(prog: list[tuple[int, int, str | None, str | None] | str]) -> bytes:
    """Classic BPF from (code, k, jump-if-true label, jump-if-false label) tuples and label strings;
    labels become the forward offsets BPF needs (a missing label falls through)."""
    where: dict[str, int] = {}
    insns: list[tuple[int, int, str | None, str | None]] = []
    for item in prog:
        if isinstance(item, str):
            where[item] = len(insns)
        else:
            insns.append(item)
    out = []
    for i, (code, k, jt, jf) in enumerate(insns):
        offsets = [0 if label is None else where[label] - i - 1 for label in (jt, jf)]
        if not all(0 <= o <= 255 for o in offsets):
            raise SandboxError("seccomp program: jump out of range")
        out.append(_insn(code, k, *offsets))
    if len(out) > 4096:  # BPF_MAXINSNS
        raise SandboxError("seccomp program too long")
    return b"".join(out)


def build_filter(arch: str | None = None, errno_value: int = errno.EPERM) -> bytes:
    """The raw ``sock_filter`` array for ``arch`` (default: this host's), as bwrap reads it."""
    arch = arch or _machine()
    if arch not in _NUMBERS:
        raise SandboxError(
            f"no seccomp syscall table for architecture {arch!r} (have: {sorted(_NUMBERS)}); "
            "pass seccomp=False in BwrapConfig to run without the filter on this host"
        )
    prog: list[tuple[int, int, str | None, str | None] | str] = [
        (_LD_W_ABS, _OFF_ARCH, None, None),
        (_JEQ_K, _AUDIT_ARCH[arch], "nr", None),
        (_RET_K, _RET_KILL_PROCESS, None, None),
        "nr",
        (_LD_W_ABS, _OFF_NR, None, None),
    ]
    if arch == "x86_64":
        prog.append((_JGE_K, _X32_SYSCALL_BIT, "deny", None))
    prog += [(_JEQ_K, nr, "socket", None) for nr in _SOCKET_CALLS[arch]]
    prog += [(_JEQ_K, _MADVISE[arch], "madvise", None)]
    prog += [(_JEQ_K, nr, "enosys", None) for nr in _ENOSYS_CALLS[arch]]
    prog += [(_JEQ_K, nr, "deny", None) for nr in sorted(set(_NUMBERS[arch].values()))]
    prog += ["allow", (_RET_K, _RET_ALLOW, None, None), "madvise", (_LD_W_ABS, _OFF_ARG2_LOW, None, None)]
    prog += [(_JEQ_K, advice, "deny", None) for advice in sorted(DENIED_ADVICE.values())]
    prog += [
        (_RET_K, _RET_ALLOW, None, None),
        "enosys",
        (_RET_K, _RET_ERRNO | errno.ENOSYS, None, None),
        "socket",
        (_LD_W_ABS, _OFF_ARG0_LOW, None, None),
    ]
    prog += [(_JEQ_K, family, "family_ok", None) for family in sorted(ALLOWED_FAMILIES.values())]
    prog += [
        (_RET_K, _RET_ERRNO | errno.EAFNOSUPPORT, None, None),
        "family_ok",
        (_RET_K, _RET_ALLOW, None, None),  # BPF jumps only forward: a second ALLOW
        "deny",
        (_RET_K, _RET_ERRNO | (errno_value & 0xFFFF), None, None),
    ]
    return _assemble(prog)


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
