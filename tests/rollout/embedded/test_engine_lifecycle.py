"""Start-up, death and shutdown of the embedded engine's process (each test owns its engine)."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from thundersync_lightning.core.errors import EngineError
from thundersync_lightning.rollout import ContentReady, EmbeddedEngineConfig, ModelSpec, make_request

from ..conftest import random_model
from ..helpers import collect
from ..procs import children
from ..scripted import ScriptedTasks

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def patient_engine(spec):
    """Verdict timeout 10 min: hung verdicts stay pending. The last test of this module kills it
    (no restarts: a replayed hung verdict would hang again)."""
    engine = EmbeddedEngineConfig(verdict_timeout_s=600, max_engine_restarts=0).build(spec, ScriptedTasks())
    yield engine
    engine.shutdown()


def test_rollout_before_the_first_publish_raises_engine_error(patient_engine):
    tasks = ScriptedTasks()
    with pytest.raises(EngineError, match="publish"):
        patient_engine.rollout(make_request(tasks, step=0, num_groups=1, group_size=2, seed=0))


def test_hung_verdicts_of_one_request_do_not_block_the_next_request(patient_engine, spec):
    patient_engine.publish(random_model(spec, 0).state_dict(), version=patient_engine.version + 1)
    hung = patient_engine.rollout(make_request(ScriptedTasks(modes=("verdict_hangs",)), 0, 1, 2, seed=0))
    after = patient_engine.rollout(make_request(ScriptedTasks(), 1, 2, 4, seed=0))
    trajectories, rewards, _ = collect(after)  # completes although the first request never will
    assert len(trajectories) == len(rewards) == 8
    assert isinstance(next(hung), ContentReady)


def test_shutdown_is_idempotent_and_leaves_no_process_behind_even_with_hung_verdicts(spec):
    before = children()
    tasks = ScriptedTasks(modes=("verdict_hangs",))
    engine = EmbeddedEngineConfig(verdict_timeout_s=600).build(spec, tasks)
    pid = engine.pid
    assert pid in children() - before
    engine.publish(random_model(spec, 0).state_dict(), version=0)
    events = engine.rollout(make_request(tasks, step=0, num_groups=1, group_size=2, seed=0))
    next(events)
    engine.shutdown()
    engine.shutdown()
    assert children() - before == set()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(EngineError, match="shut down"):
        engine.publish(random_model(spec, 0).state_dict(), version=1)


def test_versions_must_increase(engine, spec):
    state = random_model(spec, 0).state_dict()
    engine.publish(state, engine.version + 1)
    with pytest.raises(EngineError, match="versions must increase"):
        engine.publish(state, engine.version)


def test_an_engine_that_cannot_build_its_model_fails_at_start_up_with_the_reason():
    bad = ModelSpec(model_type="no_such_architecture")
    with pytest.raises(EngineError, match="no_such_architecture"):
        EmbeddedEngineConfig().build(bad, ScriptedTasks())


def test_weights_of_another_architecture_fail_the_next_rollout_with_the_mismatch(spec):
    tasks = ScriptedTasks()
    engine = EmbeddedEngineConfig().build(spec, tasks)
    try:
        state = random_model(spec, 0).state_dict()
        state.pop("model.norm.weight")
        engine.publish(state, version=0)
        with pytest.raises(EngineError, match="missing names.*model.norm.weight"):
            list(engine.rollout(make_request(tasks, step=0, num_groups=1, group_size=1, seed=0)))
    finally:
        engine.shutdown()


def test_a_task_source_that_cannot_be_pickled_is_rejected_before_anything_starts(spec):
    class LocalTasks(ScriptedTasks):  # defined in a function: not importable by the process
        pass

    with pytest.raises(EngineError, match="module level"):
        EmbeddedEngineConfig().build(spec, LocalTasks())


# Keep last: it kills the module's shared engine.
def test_a_killed_engine_process_raises_engine_error_instead_of_blocking(patient_engine, spec):
    # Not the task whose verdicts an earlier test left hanging: its episodes would wait for them.
    tasks = ScriptedTasks(modes=("verdict_hangs",), gate="another task")
    patient_engine.publish(random_model(spec, 0).state_dict(), version=patient_engine.version + 1)
    events = patient_engine.rollout(make_request(tasks, step=0, num_groups=1, group_size=2, seed=0))
    assert isinstance(next(events), ContentReady)  # its verdicts hang: the stream would wait forever
    os.kill(patient_engine.pid, signal.SIGKILL)
    with pytest.raises(EngineError, match="died"):
        list(events)
    with pytest.raises(EngineError):
        patient_engine.rollout(make_request(tasks, step=1, num_groups=1, group_size=2, seed=0))
