"""Suite-wide isolation."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

# No wall-clock deadline on property tests: CI's 2 shared cores make a run's time a fact about the
# machine's load, not about the code (a 520 ms example failed a 200 ms deadline under load).
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


def _restored() -> Iterator[None]:
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    """Fits set MASTER_PORT, WANDB_MODE and friends in os.environ; later subprocesses must not
    inherit them (a stale MASTER_PORT makes the next process group fail with EADDRINUSE)."""
    yield from _restored()


@pytest.fixture(autouse=True, scope="module")
def _restore_environment_after_module_fixtures() -> Iterator[None]:
    """The same around every module: a module-scoped fixture that fits in-process runs before the
    per-test fixture saves the environment, and Lightning's launcher leaves LOCAL_RANK, NODE_RANK,
    WORLD_SIZE and MASTER_PORT in os.environ even for one process. A later test's subprocess that
    inherits LOCAL_RANK believes an external launcher started it, spawns no other rank and waits
    for them forever."""
    yield from _restored()
