"""Fixtures for the code-environment tests: bubblewrap sandboxes with their own uid and workdir."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from thundersync_lightning.envs.sandbox import BwrapConfig, BwrapSandbox, SandboxLimits, chown_tree
from thundersync_lightning.envs.sandbox.fs import BoundedDir

from ._support import TEST_POOL

SWE_BASE_IMAGE = os.environ.get("THUNDERSYNC_TEST_IMAGE", "localhost/thundersync-pytest:latest")
SWE_TASK = "merge_intervals"


def bounded_dir(size_bytes: int = 2 * 1024**3, inodes: int = 200_000, mode: int = 0o711) -> BoundedDir:
    """A fresh directory under /tmp/thundersync-test-sandboxes with a disk and inode budget of its own
    (every sandbox needs one; the caller removes it with ``.remove()``)."""
    root = "/tmp/thundersync-test-sandboxes"
    os.makedirs(root, mode=0o711, exist_ok=True)
    return BoundedDir(tempfile.mkdtemp(dir=root), size_bytes, inodes, mode)


@pytest.fixture
def sandbox_budget() -> Iterator[BoundedDir]:
    """A bounded directory (mode 0711) for the sandboxes of one test: their workdirs go inside."""
    budget = bounded_dir()
    yield budget
    budget.remove()


@pytest.fixture
def sandbox_dir(sandbox_budget: BoundedDir) -> str:
    return sandbox_budget.path


@pytest.fixture
def make_box(sandbox_budget: BoundedDir) -> Iterator:
    """Factory: a BwrapSandbox with small limits, its own uid and an empty workdir."""
    leases = []

    def factory(*, cgroups: bool = True, seccomp: bool = True, **limits: float) -> BwrapSandbox:
        lease = TEST_POOL.acquire()
        leases.append(lease)
        work = os.path.join(sandbox_budget.path, f"w{lease.uid}")
        os.mkdir(work)
        chown_tree(work, lease.uid)
        defaults = dict(
            timeout_s=10.0,
            max_output_bytes=64 * 1024,
            nproc=64,
            memory_bytes=512 * 1024**2,
            fsize_bytes=16 * 1024**2,
        )
        defaults.update(limits)
        config = BwrapConfig(limits=SandboxLimits(**defaults), cgroups=cgroups, seccomp=seccomp)
        return BwrapSandbox(work, lease.uid, config, budget=sandbox_budget)

    yield factory
    for lease in leases:
        lease.release()


@pytest.fixture(scope="module")
def podman_service() -> Iterator:
    """A podman service on a unix socket (a sandbox host's stand-in; see :mod:`.podman_service`)."""
    from thundersync_lightning.envs.sandbox import find_engine

    from .podman_service import PodmanService

    engine = find_engine("podman")
    if engine is None:
        pytest.skip("needs podman (make test-containers)")
    service = PodmanService(engine)
    yield service
    service.close()


@pytest.fixture(scope="module")
def instance_image():
    """A local image with the SWE-bench tests' task repository (a git repo) at /testbed, built
    without pulling: (tag, base commit)."""
    from thundersync_lightning.envs.code import load_tasks
    from thundersync_lightning.envs.sandbox import find_engine, image_exists

    from ._support import git_repo

    task = load_tasks(names=[SWE_TASK])[0]
    engine = find_engine("podman")
    if engine is None or not image_exists(SWE_BASE_IMAGE, engine):
        pytest.skip(f"needs podman and the local image {SWE_BASE_IMAGE} (scripts/build_test_image.sh)")
    ctx = tempfile.mkdtemp(prefix="tsl-image-")
    try:
        base = git_repo(task, os.path.join(ctx, "testbed"))
        with open(os.path.join(ctx, "Containerfile"), "w") as f:
            f.write(f"FROM {SWE_BASE_IMAGE}\nCOPY testbed /testbed\nWORKDIR /testbed\n")
        tag = f"localhost/thundersync-swe-{task.name}:test"
        subprocess.run([engine, "build", "--pull=never", "-t", tag, ctx], check=True, capture_output=True)
        yield tag, base
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
