"""The embedded engine's generation process killed mid-step (SIGKILL, as by the OOM killer).

Within ``max_engine_restarts`` the step completes exactly: the process is restarted, the frozen
snapshot re-published, the unfinished groups regenerated from their seeds; past it, the waiting
iterator raises EngineError. Either way nothing is left: no process, no /dev/shm name.
"""

from __future__ import annotations

import os
import signal
from multiprocessing import resource_sharer

import pytest

from thundersync_lightning.core.errors import EngineError
from thundersync_lightning.rollout import ContentReady, EmbeddedEngineConfig, RewardReady, make_request

from ..conftest import random_model
from ..helpers import collect
from ..procs import children, existing_shm, gone, shm_names, wait_until
from ..scripted import ScriptedTasks

pytestmark = pytest.mark.timeout(180)

# Even groups answer at once; odd groups' verdicts wait for a gate file the test creates after the
# kill, so at the kill some groups are rewarded and the others have their content only.
MODES = ("ok", "verdict_gated")
TASKS = ScriptedTasks(modes=MODES)


def _request(step: int, gate: str = "", modes: tuple[str, ...] = MODES):
    return make_request(ScriptedTasks(modes=modes, gate=gate), step=step, num_groups=6, group_size=3, seed=4)


def _summary(events) -> dict[str, tuple]:
    trajectories, rewards, order = collect(events)
    assert len(order) == 2 * len(trajectories) == 2 * len(rewards)
    return {
        tid: (
            t.tokens,
            t.sampling_logprobs and len(t.sampling_logprobs),
            t.policy_version,
            rewards[tid].reward,
            rewards[tid].failure,
        )
        for tid, t in trajectories.items()
    }


def _parked_fds() -> int:
    """Descriptors multiprocessing's fd sharer holds for receivers that have not fetched them."""
    return len(resource_sharer._resource_sharer._cache)


def _strip_version(summary: dict[str, tuple]) -> dict[str, tuple]:
    return {k: (v[0], v[1], v[3], v[4]) for k, v in summary.items()}


@pytest.fixture(scope="module")
def engine(spec):
    before = children()
    eng = EmbeddedEngineConfig(max_engine_restarts=3, env_workers=8).build(spec, TASKS)
    yield eng
    eng.shutdown()
    assert wait_until(lambda: children() - before == set(), 10.0), "an engine process outlived shutdown"


def test_a_killed_engine_is_restarted_and_the_step_completes_with_the_same_trajectories(
    engine, spec, tmp_path
):
    gate = tmp_path / "verdicts-may-finish"
    old, new = random_model(spec, 0), random_model(spec, 1)
    engine.publish(old.state_dict(), version=0)
    reference_old = _summary(engine.rollout(_request(1)))
    engine.publish(new.state_dict(), version=1)
    reference_new = _summary(engine.rollout(_request(2)))

    # the same two requests again, each issued after its own snapshot; kill after the first reward
    engine.publish(old.state_dict(), version=2)
    first = engine.rollout(_request(1, str(gate)))
    engine.publish(new.state_dict(), version=3)
    second = engine.rollout(_request(2, str(gate)))
    dead_pid = engine.pid
    dead_shm = shm_names(dead_pid)
    assert dead_shm, "expected the engine process to map its command queue's semaphores"
    early = []
    for event in first:
        early.append(event)
        if isinstance(event, RewardReady):
            break
    os.kill(dead_pid, signal.SIGKILL)
    gate.touch()
    rerun_old = _summary([*early, *first])
    rerun_new = _summary(second)

    assert engine.restart_count == 1 and engine.pid != dead_pid
    assert _strip_version(rerun_old) == _strip_version(reference_old)
    assert _strip_version(rerun_new) == _strip_version(reference_new)
    assert {v[2] for v in rerun_old.values()} == {2} and {v[2] for v in rerun_new.values()} == {3}
    assert wait_until(lambda: gone(dead_pid), 10.0)
    assert existing_shm(dead_shm - shm_names(engine.pid)) == set(), "the dead process's segments leaked"


def test_a_replay_that_comes_out_different_fails_its_request_instead_of_pairing_wrong_rewards(
    engine, spec, tmp_path
):
    # the environment answers differently once the gate exists: not deterministic given its seed
    gate = tmp_path / "answers-change"
    engine.publish(random_model(spec, 3).state_dict(), version=engine.version + 1)
    events = engine.rollout(_request(5, str(gate), modes=("nondeterministic",)))
    assert isinstance(next(events), ContentReady)
    restarts = engine.restart_count
    os.kill(engine.pid, signal.SIGKILL)
    gate.touch()
    with pytest.raises(EngineError, match="came out different when replayed"):
        list(events)
    assert engine.restart_count == restarts + 1
    engine.publish(random_model(spec, 4).state_dict(), version=engine.version + 1)
    _, rewards, _ = collect(engine.rollout(_request(6)))  # the engine itself still works
    assert len(rewards) == 18


def test_a_publish_the_killed_process_never_read_leaves_no_file_descriptor_behind(engine, spec, tmp_path):
    # A snapshot pickled for a process parks a duplicate fd in multiprocessing's fd sharer until
    # the process fetches it; one the killed process never read must not stay parked (with the
    # snapshot's memory) for the learner's lifetime.
    gate = tmp_path / "steps-may-finish"
    engine.publish(random_model(spec, 5).state_dict(), version=engine.version + 1)
    busy = engine.rollout(_request(7, str(gate), modes=("step_gated",)))  # its steps wait for the gate
    engine.publish(random_model(spec, 6).state_dict(), version=engine.version + 1)  # queued, unread
    os.kill(engine.pid, signal.SIGKILL)
    gate.touch()
    _, rewards, _ = collect(busy)
    assert len(rewards) == 18
    # a later request is served after the replayed publishes: every snapshot sent was fetched
    _, rewards, _ = collect(engine.rollout(make_request(TASKS, step=8, num_groups=1, group_size=1, seed=4)))
    assert len(rewards) == 1
    assert _parked_fds() == 0


# Keep last: it spends the module engine's restart budget.
def test_a_kill_beyond_max_engine_restarts_raises_engine_error_and_leaves_nothing_behind(engine, spec):
    assert engine.restart_count == 3
    engine.publish(random_model(spec, 2).state_dict(), version=engine.version + 1)
    events = engine.rollout(_request(3))
    assert isinstance(next(events), ContentReady)
    pid = engine.pid
    names = shm_names(pid)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(EngineError, match=r"died \(exit code -9\).*max_engine_restarts=3"):
        list(events)
    assert wait_until(lambda: gone(pid), 10.0)
    assert wait_until(lambda: existing_shm(names) == set(), 10.0), existing_shm(names)
    with pytest.raises(EngineError, match="max_engine_restarts"):
        engine.rollout(_request(4))
