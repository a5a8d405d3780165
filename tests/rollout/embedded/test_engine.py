"""The embedded engine against the RolloutEngine contract (one shared engine process)."""

from __future__ import annotations

import multiprocessing as mp

import torch

from thundersync_lightning.core.protocols import PreparesAhead
from thundersync_lightning.rollout import (
    ContentReady,
    EmbeddedEngine,
    EmbeddedEngineConfig,
    RewardReady,
    make_request,
)

from ..conftest import random_model
from ..helpers import assert_same_outcomes, collect, learner_logprobs
from ..scripted import MODES, CountingTasks, ScriptedTasks, drain, take

OK_GROUPS = [0, 7, 14, 21]  # groups whose mode is "ok" (MODES[g % 7])


def _publish_new(engine: EmbeddedEngine, model: torch.nn.Module) -> int:
    version = engine.version + 1
    engine.publish(model.state_dict(), version)
    return version


def test_every_trajectory_yields_one_content_then_one_reward_tagged_with_its_version(
    engine, spec, scripted_tasks
):
    version = _publish_new(engine, random_model(spec, 0))
    request = make_request(
        scripted_tasks, step=3, num_groups=22, group_size=4, seed=11, group_indices=OK_GROUPS
    )
    trajectories, rewards, order = collect(engine.rollout(request))

    expected = {tid for ids in request.trajectory_ids().values() for tid in ids}
    assert set(trajectories) == expected and set(rewards) == expected
    assert len(order) == 2 * len(expected)
    seen_content: set[str] = set()
    for ev in order:
        if isinstance(ev, ContentReady):
            seen_content.add(ev.trajectory.trajectory_id)
        else:
            assert ev.trajectory_id in seen_content, "a reward arrived before its trajectory's content"
    for tid, traj in trajectories.items():
        assert traj.policy_version == version
        assert traj.submitted_at <= traj.content_ready_at <= rewards[tid].time
        assert rewards[tid].failure is None and rewards[tid].reward in (0.0, 1.0)
        assert traj.finish_reason in ("submit", "turn_limit")
        assert traj.segments[0].scored and all(not s.scored for s in traj.segments[1::2])


def test_sampling_logprobs_match_the_learner_forward_of_the_published_weights(engine, spec, scripted_tasks):
    model = random_model(spec, 1)
    _publish_new(engine, model)
    request = make_request(scripted_tasks, step=0, num_groups=8, group_size=8, seed=5, group_indices=[0, 7])
    trajectories, _, _ = collect(engine.rollout(request))

    worst = max(
        (learner_logprobs(model, t) - torch.tensor(t.sampling_logprobs)).abs().max().item()
        for t in trajectories.values()
    )
    assert worst <= 1e-4


def test_a_publish_applies_to_later_requests_only(engine, spec, scripted_tasks):
    old, new = random_model(spec, 2), random_model(spec, 3)
    request = make_request(scripted_tasks, step=1, num_groups=8, group_size=8, seed=7, group_indices=[0, 7])
    v_old = _publish_new(engine, old)
    first = engine.rollout(request)
    v_new = _publish_new(engine, new)  # issued after rollout(first): must not affect it
    second = engine.rollout(request)
    first_trajs, _, _ = collect(first)
    second_trajs, _, _ = collect(second)

    assert {t.policy_version for t in first_trajs.values()} == {v_old}
    assert {t.policy_version for t in second_trajs.values()} == {v_new}
    for trajs, model in ((first_trajs, old), (second_trajs, new)):
        for t in trajs.values():
            assert torch.allclose(learner_logprobs(model, t), torch.tensor(t.sampling_logprobs), atol=1e-4)
    assert any(first_trajs[k].tokens != second_trajs[k].tokens for k in first_trajs)


def test_same_seed_and_weights_give_the_same_trajectories_whatever_the_batch_split(
    engine, spec, scripted_tasks
):
    _publish_new(engine, random_model(spec, 4))

    def run(groups: list[int]) -> tuple[dict, dict]:
        request = make_request(
            scripted_tasks, step=9, num_groups=22, group_size=4, seed=3, group_indices=groups
        )
        trajs, rewards, _ = collect(engine.rollout(request))
        return {k: t.tokens for k, t in trajs.items()}, {k: r.reward for k, r in rewards.items()}

    whole = run(OK_GROUPS)
    halves = [run(OK_GROUPS[:2]), run(OK_GROUPS[2:])]
    reversed_order = run(OK_GROUPS[::-1])
    merged = ({**halves[0][0], **halves[1][0]}, {**halves[0][1], **halves[1][1]})
    assert merged == whole
    assert reversed_order == whole


def test_crashing_hanging_or_malformed_environments_give_reward_zero_with_a_reason(engine, spec):
    # group g behaves as MODES[g]; step/verdict timeouts are 0.5 s in this engine
    _publish_new(engine, random_model(spec, 5))
    request = make_request(ScriptedTasks(modes=MODES), step=2, num_groups=len(MODES), group_size=2, seed=1)
    trajectories, rewards, _ = collect(engine.rollout(request))

    def failure_of(mode: str) -> str | None:
        reasons = {rewards[f"s2-g{MODES.index(mode)}-t{k}"].failure for k in range(2)}
        assert len(reasons) == 1
        return reasons.pop()

    assert failure_of("ok") is None
    assert "verdict raised RuntimeError: test runner crashed" == failure_of("verdict_raises")
    assert "verdict timed out" in failure_of("verdict_hangs")
    assert failure_of("verdict_malformed") == "verdict returned str 'PASSED', not a real number"
    assert "step raised ValueError: tool crashed" == failure_of("step_raises")
    assert "step timed out" in failure_of("step_hangs")
    assert "reset raised RuntimeError" in failure_of("reset_raises")
    assert all(r.reward == 0.0 for r in rewards.values() if r.failure is not None)
    for mode in ("step_raises", "step_hangs", "reset_raises"):
        traj = trajectories[f"s2-g{MODES.index(mode)}-t0"]
        assert traj.finish_reason == "failure" and traj.failure == failure_of(mode)
    assert isinstance(next(iter(rewards.values())), RewardReady)


def _counting_tasks() -> CountingTasks:
    ctx = mp.get_context("spawn")  # semaphores the engine process counts in and this test reads
    return CountingTasks(
        modes=("ok", "reset_raises", "step_raises"), made=ctx.Semaphore(0), closed=ctx.Semaphore(0)
    )


def test_a_prepared_request_gives_the_same_events_and_its_rollout_creates_no_environment_again(spec):
    tasks = _counting_tasks()
    request = make_request(
        tasks, step=4, num_groups=3, group_size=4, seed=3
    )  # 8 environments (one group fails)
    with EmbeddedEngineConfig(step_timeout_s=5.0).build(spec, tasks) as engine:
        assert isinstance(engine, PreparesAhead)
        engine.prepare(request)  # before any weights exist
        assert take(tasks.made, 8) == 8  # created by prepare: nothing was rolled out yet
        _publish_new(engine, random_model(spec, 4))
        prepared = list(engine.rollout(request))
        assert drain(tasks.made) == 0  # the rollout used them

        unprepared = list(engine.rollout(request))
        assert drain(tasks.made) == 8
    assert_same_outcomes(prepared, unprepared)
    _, rewards, _ = collect(prepared)
    assert sum(r.failure is not None for r in rewards.values()) == 8  # the reset and step failures


def test_prepared_environments_never_rolled_out_are_closed_when_the_engine_shuts_down(spec):
    tasks = _counting_tasks()
    engine = EmbeddedEngineConfig(step_timeout_s=5.0).build(spec, tasks)
    engine.prepare(make_request(tasks, step=0, num_groups=1, group_size=3, seed=0))
    assert take(tasks.made, 3) == 3
    engine.shutdown()
    assert drain(tasks.closed) == 3
