"""On-policy distillation through the strategy: same gradient streaming and sync; no teacher, no start."""

from __future__ import annotations

import pytest

from thundersync_lightning.core import ConfigError, Objective
from thundersync_lightning.rollout import EmbeddedEngineConfig, TeacherConfig, TraceReplayEngineConfig

from ._fit import TOY_MODEL
from .test_objective_checks_modes import _fit

TEACHER = TeacherConfig(model_type="qwen3", config={**TOY_MODEL, "hidden_size": 32, "num_attention_heads": 2})


def _engine() -> EmbeddedEngineConfig:
    return EmbeddedEngineConfig(num_threads=1, env_workers=4, teacher=TEACHER)


def test_opd_with_grpo_streams_the_same_gradient_as_sync_and_opd_alone_trains_without_rewards():
    objective = Objective(opd_coef=0.5, loss_agg="token-mean")
    streaming, steps = _fit("streaming", objective, engine=_engine())
    sync, _ = _fit("sync", objective, engine=_engine())
    assert len(streaming) == len(sync) == 2
    for a, b in zip(streaming, sync):
        assert float(b.norm()) > 0
        assert float((a - b).norm() / b.norm()) <= 1e-5
    assert all(s.staleness_max == 0 for s in steps)
    alone, _ = _fit(
        "sync", Objective(opd_coef=0.5, reward_coef=0.0, loss_agg="token-mean"), steps=1, engine=_engine()
    )
    assert float(alone[0].norm()) > 0  # the teacher's signal alone moves the student
    assert float((alone[0] - sync[0]).norm() / sync[0].norm()) > 1e-3  # and the reward term is part of sync's


@pytest.mark.parametrize(
    "engine, match",
    [
        (
            EmbeddedEngineConfig(num_threads=1, env_workers=4),
            "opd_coef=0.5 needs a teacher's logprobs.*EmbeddedEngineConfig has no teacher",
        ),
        (TraceReplayEngineConfig(time_scale_s=0.001), "TraceReplayEngineConfig has no teacher"),
    ],
)
def test_opd_on_an_engine_without_a_teacher_is_refused_before_any_rollout(engine, match):
    with pytest.raises(ConfigError, match=match):
        _fit("streaming", Objective(opd_coef=0.5), engine=engine)
