"""The generation process's start methods: forked from multiprocessing's fork server, or spawned.

Both must give the same trajectories and see the learner's environment as it is when the
process starts; the fork server is a shared helper of the learner process, not an engine.
"""

from __future__ import annotations

import os

import psutil
import pytest

from thundersync_lightning.rollout import EmbeddedEngineConfig, make_request

from ..conftest import random_model
from ..helpers import collect
from ..procs import children
from ..scripted import ENV_MARK, ScriptedTasks

pytestmark = pytest.mark.timeout(180)

METHODS = ["forkserver", "spawn"]


def _rollout(method: str, spec, tasks: ScriptedTasks, seed: int = 3):
    engine = EmbeddedEngineConfig(start_method=method).build(spec, tasks)
    try:
        engine.publish(random_model(spec, 7).state_dict(), version=0)
        trajectories, rewards, _ = collect(
            engine.rollout(make_request(tasks, step=1, num_groups=3, group_size=4, seed=seed))
        )
        parent = psutil.Process(engine.pid).ppid()
    finally:
        engine.shutdown()
    return trajectories, rewards, parent


def test_forked_and_spawned_engines_give_the_same_trajectories_and_rewards(spec):
    tasks = ScriptedTasks(modes=("ok",))
    forked, forked_rewards, forked_parent = _rollout("forkserver", spec, tasks)
    spawned, spawned_rewards, spawned_parent = _rollout("spawn", spec, tasks)

    assert forked.keys() == spawned.keys() and len(forked) == 12
    for tid, traj in forked.items():
        assert traj.tokens == spawned[tid].tokens
        assert forked_rewards[tid].reward == spawned_rewards[tid].reward
        # a turn's batch depends on which environments have answered: rounding, not sampling, differs
        for mine, theirs in zip(traj.segments, spawned[tid].segments):
            assert (mine.logprobs is None) == (theirs.logprobs is None)
            if mine.logprobs is not None:
                assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)
    # each method is the one used: spawn's process is the learner's child, the forked one the server's
    assert spawned_parent == os.getpid()
    assert forked_parent != os.getpid() and psutil.Process(forked_parent).ppid() == os.getpid()


@pytest.mark.parametrize(
    "method", ["forkserver", pytest.param("spawn", marks=pytest.mark.slow)]
)  # spawn: ~12 s
def test_the_engine_process_sees_the_learners_environment_as_it_is_when_the_process_starts(
    spec, monkeypatch, method
):
    tasks = ScriptedTasks(modes=("verdict_env",))
    monkeypatch.delenv(ENV_MARK, raising=False)
    _, unmarked, _ = _rollout(method, spec, tasks)  # also starts the fork server, without the mark
    monkeypatch.setenv(ENV_MARK, "1")
    _, marked, _ = _rollout(method, spec, tasks)

    assert {r.reward for r in unmarked.values()} == {0.0}
    assert {r.reward for r in marked.values()} == {1.0}


def test_the_fork_server_is_not_counted_as_a_process_an_engine_left_behind(spec):
    before = children()
    _rollout("forkserver", spec, ScriptedTasks(modes=("ok",)))
    assert children() - before == set()
