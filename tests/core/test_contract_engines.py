"""The engine contract (``core.contract.ENGINE_CONTRACT``): every engine config declares what it
samples (``EngineSampling``) and what it takes of the learner's machine (``EngineFootprint``), and
the strategy and the memory plan read those typed values, never an engine's fields by name.

``RandomTokensEngineConfig`` below is a whole new engine in one file (design.md, "Where a change
goes"): a config with ``build``, ``sampling`` and ``footprint``, and an engine with ``version``,
``publish``, ``rollout`` and ``shutdown``; it trains through a fit with no other file touched.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import lightning as L
import pytest
from torch import Tensor

import thundersync_lightning  # noqa: F401  registers strategy="thundersync"
from thundersync_lightning import rollout
from thundersync_lightning.core import EngineFootprint, EngineSampling
from thundersync_lightning.core.contract import ENGINE_CONTRACT, check_engine
from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.core.grpo.objective import Objective
from thundersync_lightning.core.types import (
    ContentReady,
    ModelSpec,
    RewardReady,
    RolloutEvent,
    RolloutRequest,
    Segment,
    Trajectory,
    derive_seed,
    trajectory_id,
)
from thundersync_lightning.envs.toy import GuessingGameTasks, toy_model_spec
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.planning.model_shape import ModelShape
from thundersync_lightning.rollout import (
    EmbeddedEngineConfig,
    EnginePoolConfig,
    TraceReplayEngineConfig,
    VLLMEngineConfig,
    VLLMServerEngineConfig,
)
from thundersync_lightning.strategy.memory_check import plan_inputs
from thundersync_lightning.strategy.objective_checks import check_objective

#: One config of every engine the package ships, and a pool of each.
SHIPPED = [
    EmbeddedEngineConfig(),
    TraceReplayEngineConfig(),
    VLLMEngineConfig(max_model_len=512),
    VLLMServerEngineConfig(urls=["http://10.0.0.2:8000"], max_model_len=512),
]
ENGINES = SHIPPED + [EnginePoolConfig(engine=e, num_engines=1) for e in SHIPPED]


def _name(engine: Any) -> str:
    inner = getattr(engine, "engine", None)
    return type(engine).__name__ + (f"[{type(inner).__name__}]" if inner is not None else "")


def test_every_engine_config_the_package_exports_is_among_those_checked():
    exported = {
        getattr(rollout, n) for n in rollout.__all__
        if isinstance(getattr(rollout, n), type) and callable(getattr(getattr(rollout, n), "build", None))
    }  # fmt: skip
    assert exported == {type(e) for e in ENGINES}


@pytest.mark.parametrize("engine", ENGINES, ids=_name)
def test_every_engine_config_fits_the_contract_with_typed_sampling_and_footprint(engine):
    assert check_engine(engine) == []
    assert [m.name for m in ENGINE_CONTRACT] == ["build", "sampling", "footprint"]
    assert isinstance(engine.sampling, EngineSampling) and isinstance(engine.footprint, EngineFootprint)
    assert (
        engine.sampling.temperature in (None, 1.0)
        and engine.sampling.top_p == 1.0
        and engine.sampling.top_k == 0
    )


@pytest.mark.parametrize("engine", [e for e in ENGINES if e.footprint.max_context_tokens], ids=_name)
def test_an_engines_context_limit_bounds_the_planned_trajectory_also_inside_a_pool(engine):
    inputs = plan_inputs(
        model=ModelShape(1000, 1000, 4), objective=Objective(), accelerator="cpu", world_size=1,
        strategy={}, data={}, engine=engine.footprint,
    )  # fmt: skip
    assert inputs.tokens_bounded and inputs.max_tokens_per_trajectory == 512


def test_a_pool_of_colocated_engines_plans_each_engines_share_and_a_placed_pool_only_engine_zeros():
    vllm = VLLMEngineConfig(
        multiprocessing=True, weight_sync="ipc", kv_cache_memory_bytes=None, gpu_memory_utilization=0.3
    )
    shared = EnginePoolConfig(engine=vllm, num_engines=2).footprint
    assert shared.device_fraction == pytest.approx(0.6) and shared.weight_sync_buckets == 4
    placed = EnginePoolConfig(
        engine=vllm, num_engines=2, per_engine=[{}, {"engine_kwargs": {"device_ids": [1]}}]
    )
    assert (
        placed.footprint.device_fraction == pytest.approx(0.3) and placed.footprint.weight_sync_buckets == 2
    )


def test_an_in_process_engine_refuses_a_pool_for_the_reason_its_footprint_declares():
    reason = VLLMEngineConfig().footprint.exclusive_in_process
    assert reason is not None and "multiprocessing: true" in reason
    with pytest.raises(ConfigError, match="multiprocessing: true"):
        EnginePoolConfig(engine=VLLMEngineConfig(), num_engines=2)


def test_the_on_policy_checks_read_the_declared_sampling_of_an_engine_with_no_sampling_fields():
    class _Module:
        hparams = {"temperature": 1.0}
        has_reference_policy = True
        objective = Objective()

    class _Data:
        engine_factory = RandomTokensEngineConfig(sampling=EngineSampling(temperature=0.5, top_k=5))

    problems = check_objective(_Module(), _Data())
    assert len(problems) == 1
    assert "policy temperature 1.0 vs engine temperature 0.5" in problems[0] and "top_k=5" in problems[0]
    _Module.objective = Objective(is_correction="token_truncate")
    _Data.engine_factory = RandomTokensEngineConfig()  # declares logprobs=False
    assert any("needs the engine's sampling logprobs" in p for p in check_objective(_Module(), _Data()))


def test_an_engine_config_without_the_declared_members_is_named_in_the_set_up_error():
    class _BuildOnly:
        def build(self, model_spec, tasks):  # noqa: ANN001, ANN201
            raise AssertionError("must not start")

    problems = check_engine(_BuildOnly())
    assert len(problems) == 2 and "has no `sampling`" in problems[0] and "has no `footprint`" in problems[1]


# -- a new engine in one file -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RandomTokensEngineConfig:
    """An engine that acts with uniformly random tokens: it samples no policy, so it declares no
    temperature and no logprobs, and it takes nothing of the learner's device."""

    sampling: EngineSampling = EngineSampling(temperature=None, logprobs=False)
    footprint: EngineFootprint = EngineFootprint()

    def build(self, model_spec: ModelSpec, tasks: Any) -> RandomTokensEngine:
        return RandomTokensEngine(int(model_spec.config["vocab_size"]), tasks)


class RandomTokensEngine:
    def __init__(self, vocab: int, tasks: Any) -> None:
        self._vocab, self._tasks, self._version = vocab, tasks, -1

    @property
    def version(self) -> int:
        return self._version

    def publish(self, weights: Mapping[str, Tensor], version: int) -> None:
        self._version = version  # random tokens need no weights

    def rollout(self, request: RolloutRequest) -> Iterator[RolloutEvent]:
        version = self._version  # the weights current when the request was issued
        episodes = [(g, s) for g in request.groups for s in range(g.size)]
        return iter([e for g, s in episodes for e in self._episode(request, g, s, version)])

    def _episode(self, request: RolloutRequest, group: Any, sample: int, version: int) -> list[RolloutEvent]:
        seed = derive_seed(request.seed, request.step, group.group_index, sample)
        rng, env = random.Random(seed), self._tasks.make_env(group.task, seed)
        prompt, segments, done, turns = tuple(env.reset()), [], False, 0
        while not done and turns < self._tasks.max_turns:
            action = tuple(rng.randrange(self._vocab) for _ in range(self._tasks.max_action_tokens))
            result = env.step(action)
            segments += [Segment(action, scored=True), Segment(tuple(result.observation), scored=False)]
            done, turns = result.done, turns + 1
        reward, now = float(env.verdict()), time.monotonic()
        env.close()
        tid = trajectory_id(request.step, group.group_index, sample)
        trajectory = Trajectory(tid, group.group_id, sample, prompt, tuple(s for s in segments if s.tokens),
                                version, turns, "submit" if done else "turn_limit", now, now)  # fmt: skip
        return [ContentReady(trajectory, now), RewardReady(tid, group.group_id, reward, now)]

    def shutdown(self) -> None:
        pass


def test_a_new_engine_in_one_file_trains_through_a_fit():
    data = RolloutDataModule(tasks=GuessingGameTasks(latency="none"), engine=RandomTokensEngineConfig(),
                             group_size=2, groups_per_step=2)  # fmt: skip
    policy = GRPOPolicy(config=dict(toy_model_spec().config))
    trainer = L.Trainer(
        strategy="thundersync", accelerator="cpu", devices=1, max_steps=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(policy, data)
    assert trainer.global_step == 1
    trained = trainer.strategy.last_step_stats.trajectories
    assert len(trained) == 4 and all(t.staleness == 0 and t.num_scored_tokens > 0 for t in trained)
