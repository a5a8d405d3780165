"""Engine-core faults with worker processes (``multiprocessing=True``) on CPU: a killed engine core is
restarted and the fit replays exactly; a killed learner takes every vLLM process with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from ..procs import gone, wait_until
from .test_worker_processes import ROOT, run

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def test_a_fit_whose_engine_core_is_killed_mid_step_completes_every_step_with_the_uncrashed_parameters():
    proc = run([sys.executable, "-m", "tests.rollout.vllm.mp_restart"], cwd=ROOT)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    fits, budget = result["fits"], result["budget"]

    assert fits["killed"] and fits["restarts_crashed"] == 1 and fits["restarts_plain"] == 0
    assert fits["steps"] == [12, 12]
    # the same tokens and rewards in every step (the republished weights, the same seeds), so the
    # same parameters up to the float rounding of the events' arrival order (see test_engine_prepare)
    assert fits["same_outcomes"] == [True, True]
    assert fits["relative"] <= 1e-4
    # past max_engine_restarts the engine fails, naming the death and the budget, and stays failed
    assert "engine core" in budget["rollout"] and "max_engine_restarts=0" in budget["rollout"]
    assert "max_engine_restarts=0" in budget["publish"]


def test_every_vllm_process_exits_within_seconds_when_its_learner_is_sigkilled():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]), HF_HUB_OFFLINE="1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    learner = subprocess.Popen(
        [sys.executable, "-m", "tests.rollout.vllm.orphan_vllm_learner"],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    descendants: list[int] = []
    try:
        line = next((x for x in learner.stdout if x.startswith("PIDS ")), "")  # vLLM logs to stdout too
        assert line, "the learner exited before its engine was up"
        learner_pid, *descendants = map(int, line.split()[1:])
        assert learner_pid == learner.pid and descendants and not any(gone(p) for p in descendants)
        os.kill(learner.pid, signal.SIGKILL)
        learner.wait(timeout=30)
        assert wait_until(lambda: all(gone(p) for p in descendants), deadline_s=30.0), (
            f"left running: {[p for p in descendants if not gone(p)]}"
        )
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.wait()
        for pid in descendants:  # do not leak them when the test fails
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
