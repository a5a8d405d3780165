"""Fixtures for the code-environment tests: bubblewrap sandboxes with their own uid and workdir."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from thundersync_lightning.envs.sandbox import BwrapConfig, BwrapSandbox, SandboxLimits, chown_tree
from thundersync_lightning.envs.sandbox.fs import remove_tree

from ._support import TEST_POOL


@pytest.fixture
def sandbox_dir() -> Iterator[str]:
    root = "/tmp/thundersync-test-sandboxes"
    os.makedirs(root, mode=0o711, exist_ok=True)
    d = tempfile.mkdtemp(dir=root)
    os.chmod(d, 0o711)
    yield d
    remove_tree(d)


@pytest.fixture
def make_box(sandbox_dir: str) -> Iterator:
    """Factory: a BwrapSandbox with small limits, its own uid and an empty workdir."""
    leases = []

    def factory(*, cgroups: bool = True, seccomp: bool = True, **limits: float) -> BwrapSandbox:
        lease = TEST_POOL.acquire()
        leases.append(lease)
        work = os.path.join(sandbox_dir, f"w{lease.uid}")
        os.mkdir(work)
        chown_tree(work, lease.uid)
        defaults = dict(timeout_s=10.0, max_output_bytes=64 * 1024, nproc=64, memory_bytes=512 * 1024**2,
                        fsize_bytes=16 * 1024**2)
        defaults.update(limits)
        config = BwrapConfig(limits=SandboxLimits(**defaults), cgroups=cgroups, seccomp=seccomp)
        return BwrapSandbox(work, lease.uid, config)

    yield factory
    for lease in leases:
        lease.release()
