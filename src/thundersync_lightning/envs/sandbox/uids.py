"""A pool of unprivileged host uids, one per live sandbox, shared safely between processes.

``RLIMIT_NPROC`` is counted per host uid, so two sandboxes sharing a uid would share one process
budget (and could signal each other's processes). Each lease holds an exclusive ``flock`` on
``<lock_dir>/<uid>.lock``: the kernel releases it when the holder dies, so a crashed engine never
leaks a uid, and independent processes (engine, tests) never hand out the same uid twice.
"""

from __future__ import annotations

import fcntl
import os
import threading
from dataclasses import dataclass, field

from ...core.errors import ConfigError
from .base import SandboxError

__all__ = ["UidLease", "UidPool", "uid_pool"]

_DEFAULT_LOCK_DIR = "/tmp/thundersync-sandbox-uids"


@dataclass
class UidLease:
    """An exclusively held uid; :meth:`release` is idempotent."""

    uid: int
    _fd: int | None = field(repr=False, default=None)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock

    @property
    def held(self) -> bool:
        return self._fd is not None


class UidPool:
    """Hands out uids from ``[base, base + size)``; each uid is held by at most one lease anywhere."""

    def __init__(self, base: int = 3_100_000, size: int = 512, lock_dir: str = _DEFAULT_LOCK_DIR) -> None:
        if base < 1000 or size < 1:
            raise ConfigError(f"UidPool(base={base}, size={size}): need base >= 1000 and size >= 1")
        self.base, self.size, self.lock_dir = base, size, lock_dir
        self._next = 0
        self._mutex = threading.Lock()

    def acquire(self) -> UidLease:
        os.makedirs(self.lock_dir, mode=0o700, exist_ok=True)
        with self._mutex:
            for k in range(self.size):
                uid = self.base + (self._next + k) % self.size
                fd = os.open(os.path.join(self.lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._next = (self._next + k + 1) % self.size
                return UidLease(uid, fd)
        raise SandboxError(
            f"all {self.size} sandbox uids in [{self.base}, {self.base + self.size}) are in use: "
            "close environments you no longer need, or give the UidPool a larger size."
        )


_POOLS: dict[tuple[int, int], UidPool] = {}
_POOLS_LOCK = threading.Lock()


def uid_pool(base: int, size: int) -> UidPool:
    """One pool per (base, size) per process: every task family leasing uids from that range shares it,
    so no two of the process's workspaces hold one uid at once."""
    with _POOLS_LOCK:
        if (base, size) not in _POOLS:
            _POOLS[(base, size)] = UidPool(base, size)
        return _POOLS[(base, size)]
