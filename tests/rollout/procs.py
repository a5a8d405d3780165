"""What a test process owns: child processes and the /dev/shm names its engine processes map."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

_SHARED_HELPERS = ("resource_tracker", "multiprocessing.forkserver")


def children() -> set[int]:
    """Live child processes of this process (grandchildren included), minus multiprocessing's
    shared helpers: the resource tracker and the fork server, each a direct child started once and
    kept for the interpreter's lifetime (processes forked by the server share its command line but
    are its children, and count)."""
    me = os.getpid()
    pids = set()
    for p in psutil.Process().children(recursive=True):
        try:
            helper = p.ppid() == me and any(h in " ".join(p.cmdline()) for h in _SHARED_HELPERS)
            if p.status() != psutil.STATUS_ZOMBIE and not helper:
                pids.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie waiting to be reaped)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def shm_names(pid: int) -> set[str]:
    """Names under /dev/shm that process ``pid`` maps (its queues' named semaphores)."""
    names = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if (
                len(fields) >= 6
                and fields[5].startswith("/dev/shm/")
                and not line.rstrip().endswith("(deleted)")
            ):
                names.add(fields[5].removeprefix("/dev/shm/"))
    return names


def existing_shm(names: set[str]) -> set[str]:
    return {n for n in names if os.path.exists(os.path.join("/dev/shm", n))}


def wait_until(condition: Callable[[], bool], deadline_s: float) -> bool:
    """Poll ``condition`` until it holds or ``deadline_s`` passes; returns its last value."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            return condition()
        time.sleep(0.05)
    return True
