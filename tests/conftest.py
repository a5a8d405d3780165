"""Suite-wide isolation."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _restore_environment():
    """Fits set MASTER_PORT, WANDB_MODE and friends in os.environ; later subprocesses must not
    inherit them (a stale MASTER_PORT makes the next process group fail with EADDRINUSE)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
