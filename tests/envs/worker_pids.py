"""A tool for tests/envs/tools/test_workers_reuse.py: each call marks ``directory`` and returns its
worker's pid once ``count`` calls have marked it (so ``count`` calls are running at once)."""

from __future__ import annotations

import os
import time


def meet(directory: str, count: int, wave: str) -> str:
    open(os.path.join(directory, f"{wave}-{os.getpid()}"), "w").close()
    deadline = time.monotonic() + 60.0
    while sum(name.startswith(f"{wave}-") for name in os.listdir(directory)) < count:
        if time.monotonic() > deadline:
            return "timeout"
        time.sleep(0.01)  # inside the worker: waits for the other calls of its wave to start
    return str(os.getpid())
