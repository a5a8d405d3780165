"""``prepare_ahead``: the next step's weight-independent rollout work starts when a step starts."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest

import thundersync_lightning  # noqa: F401  registers strategy="thundersync"
from thundersync_lightning.core.protocols import PreparesAhead
from thundersync_lightning.core.types import RolloutRequest
from thundersync_lightning.envs.toy import GuessingGameTasks
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.rollout import TraceReplayEngine, TraceReplayEngineConfig
from thundersync_lightning.strategy import ThunderSyncStrategy

from ._fit import TOY_MODEL, fit, outcomes, relative

STEPS = 3


class _RecordingReplay:
    """Builds a replay engine that logs (event, step, engine version at the time) for prepare and rollout."""

    sampling = TraceReplayEngineConfig().sampling  # the engine contract: it builds trace replays
    footprint = TraceReplayEngineConfig().footprint

    def __init__(self) -> None:
        self.log: list[tuple[str, int, int]] = []

    def build(self, model_spec: Any, tasks: Any = None) -> TraceReplayEngine:
        log = self.log

        class Engine(TraceReplayEngine):
            def prepare(self, request: RolloutRequest) -> None:
                log.append(("prepare", request.step, self.version))
                super().prepare(request)

            def rollout(self, request: RolloutRequest) -> Any:
                log.append(("rollout", request.step, self.version))
                return super().rollout(request)

        return Engine(model_spec, TraceReplayEngineConfig(time_scale_s=1e-5, setup_fraction=0.5))


def _fit(mode: str, **strategy: Any) -> list[tuple[str, int, int]]:
    L.seed_everything(0)
    factory = _RecordingReplay()
    data = RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"), engine=factory, group_size=2, groups_per_step=2, seed=0
    )
    trainer = L.Trainer(
        strategy=ThunderSyncStrategy(mode=mode, **strategy),
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(GRPOPolicy(config=TOY_MODEL, lr=1e-3), data)
    return factory.log


def test_the_replay_engine_implements_the_prepares_ahead_protocol():
    engine = TraceReplayEngineConfig().build(GuessingGameTasks(latency="none").model_spec())
    assert isinstance(engine, PreparesAhead)


@pytest.mark.parametrize("mode", ["streaming", "sync"])
def test_each_step_prepares_the_next_one_before_its_weights_exist_and_never_past_max_steps(mode):
    log = _fit(mode)
    prepared = [(step, version) for kind, step, version in log if kind == "prepare"]
    assert prepared == [(1, 0), (2, 1)]  # step k+1 prepared while version k is the newest
    rolled = [(step, version) for kind, step, version in log if kind == "rollout"]
    assert rolled == [(0, 0), (1, 1), (2, 2)]  # and generated only with its own weights
    assert log.index(("prepare", 1, 0)) < log.index(("rollout", 1, 1))


def test_async_prepares_the_step_after_the_one_it_already_issued():
    log = _fit("async")
    assert [(s, v) for kind, s, v in log if kind == "prepare"] == [(2, 0)]
    assert [s for kind, s, _ in log if kind == "rollout"] == [0, 1, 2]


def test_prepare_ahead_off_leaves_the_engine_unprepared():
    log = _fit("streaming", prepare_ahead=False)
    assert [kind for kind, _, _ in log] == ["rollout"] * STEPS


@pytest.mark.parametrize(
    "mode",
    [
        "streaming",
        pytest.param("sync", marks=pytest.mark.slow),
        pytest.param("async", marks=pytest.mark.slow),
    ],
)
def test_the_embedded_engine_trains_the_same_parameters_with_and_without_prepare_ahead(mode):
    # float64: the two differ by summation order alone, which load cannot push past the bound
    prepared, prepared_steps, _ = fit(
        mode, steps=STEPS, strategy_kwargs={"prepare_ahead": True}, dtype="float64"
    )
    unprepared, unprepared_steps, _ = fit(
        mode, steps=STEPS, strategy_kwargs={"prepare_ahead": False}, dtype="float64"
    )
    assert [outcomes(s) for s in prepared_steps] == [outcomes(s) for s in unprepared_steps]
    # the same trajectories and rewards; logprobs and the summation order of gradients follow batch
    # composition and completion order by float rounding only (the streaming == sync criterion)
    assert relative(prepared, unprepared) <= 1e-5
