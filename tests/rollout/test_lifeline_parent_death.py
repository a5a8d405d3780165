"""A learner killed by SIGKILL (no clean-up runs) takes its engine process with it."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from thundersync_lightning.rollout.lifeline import die_with_parent, parent_death_signal_armed, wait_for_exit

from .procs import gone, wait_until

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
METHODS = ["forkserver", "spawn"]  # the engine's start methods (EmbeddedEngineConfig.start_method)


# spawn starts a fresh interpreter per engine (~12 s): make test-slow; forkserver is the default method
@pytest.mark.parametrize("method", ["forkserver", pytest.param("spawn", marks=pytest.mark.slow)])
def test_an_engine_process_dies_within_seconds_when_its_learner_is_sigkilled(method):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]), HF_HUB_OFFLINE="1")
    learner = subprocess.Popen(
        [sys.executable, "-m", "tests.rollout.orphan_learner", method],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    engine_pid = None
    try:
        line = learner.stdout.readline()  # bounded by the module timeout
        learner_pid, engine_pid = map(int, line.split())
        assert learner_pid == learner.pid and not gone(engine_pid)
        os.kill(learner.pid, signal.SIGKILL)
        learner.wait(timeout=10)
        assert wait_until(lambda: gone(engine_pid), deadline_s=10.0), "the engine outlived its learner"
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.wait()
        if engine_pid is not None and not gone(engine_pid):  # do not leak it when the test fails
            os.kill(engine_pid, signal.SIGKILL)


@pytest.mark.parametrize("method", METHODS)
def test_a_child_whose_learner_is_already_gone_exits_at_once(method):
    # The child is told another pid is its learner: as if the learner had died while it started.
    child = multiprocessing.get_context(method).Process(target=die_with_parent, args=(os.getpid() + 10**6,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 1


def _armed_child(parent_pid: int) -> None:
    die_with_parent(parent_pid)
    sys.exit(0 if parent_death_signal_armed() else 3)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
@pytest.mark.parametrize("method", METHODS)
def test_a_child_that_calls_die_with_parent_has_the_kernel_parent_death_signal_armed(method):
    child = multiprocessing.get_context(method).Process(target=_armed_child, args=(os.getpid(),))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0


def test_wait_for_exit_returns_once_the_process_has_exited_even_before_it_is_reaped():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        waiter = threading.Thread(target=wait_for_exit, args=(child.pid,), daemon=True)
        waiter.start()
        assert waiter.is_alive() and not gone(child.pid)
        os.kill(child.pid, signal.SIGKILL)  # a zombie until child.wait() below
        waiter.join(timeout=30)
        assert not waiter.is_alive()
    finally:
        child.kill()
        child.wait()
    wait_for_exit(child.pid)  # reaped: returns at once
