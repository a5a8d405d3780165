"""The OPD teacher: scored in the engine process, equal to a transformers forward; bad teachers refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from thundersync_lightning.core import ConfigError, Segment, Trajectory
from thundersync_lightning.envs.toy import GuessingGameTasks, toy_model_spec
from thundersync_lightning.rollout import (
    EmbeddedEngineConfig,
    TeacherConfig,
    TeacherScorer,
    load_teacher,
    make_request,
)
from thundersync_lightning.rollout.teacher import teacher_input

from .conftest import random_model
from .helpers import collect, learner_logprobs

TEMPERATURE = 1.3


def _checkpoint(path: Path, model: torch.nn.Module, **hparams: object) -> str:
    """A file laid out like a GRPOPolicy Lightning checkpoint (hyper_parameters, state_dict 'model.*')."""
    spec = toy_model_spec()
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    state["reference.lm_head.weight"] = torch.zeros(1)  # other submodules are ignored
    base = {
        "model_type": spec.model_type,
        "config": dict(spec.config),
        "pretrained_path": None,
        "dtype": "float32",
        "lora": None,
        "lr": 3e-3,
    }
    torch.save({"hyper_parameters": {**base, **hparams}, "state_dict": state, "epoch": 0}, path)
    return str(path)


def test_teacher_logprobs_from_the_embedded_engine_equal_a_transformers_forward_of_the_teacher(tmp_path):
    spec = toy_model_spec()
    student, teacher = random_model(spec, 0), random_model(spec, 1)
    config = EmbeddedEngineConfig(
        temperature=TEMPERATURE,
        env_workers=4,
        teacher=TeacherConfig(ckpt_path=_checkpoint(tmp_path / "t.ckpt", teacher)),
    )
    tasks = GuessingGameTasks(latency="none")
    with config.build(spec, tasks) as engine:
        engine.publish(student.state_dict(), version=0)
        trajectories, _, _ = collect(
            engine.rollout(make_request(tasks, step=0, num_groups=3, group_size=4, seed=2))
        )
    assert len(trajectories) == 12
    worst_teacher, worst_student = 0.0, 0.0
    for t in trajectories.values():
        assert all(s.teacher_logprobs is None for s in t.segments if not s.scored)
        got = torch.tensor(t.teacher_logprobs)
        worst_teacher = max(
            worst_teacher, float((got - learner_logprobs(teacher, t, TEMPERATURE)).abs().max())
        )
        worst_student = max(worst_student, float((got - torch.tensor(t.sampling_logprobs)).abs().max()))
    assert worst_teacher <= 1e-5
    assert worst_student > 1e-2  # the teacher is another model than the one sampling


def _episode() -> Trajectory:
    segments = (
        Segment((3, 1), True, (-1.0, -1.0)),
        Segment((9, 10), False),
        Segment((5,), True, (-1.0,)),
        Segment((), True, ()),
    )
    return Trajectory("t0", "g0", 0, (12, 2), segments, 0, 2, "submit", 0.0, 0.0)


def test_the_scorer_fills_every_scored_segment_from_a_local_pretrained_directory(tmp_path):
    spec = toy_model_spec()
    teacher = random_model(spec, 4)
    teacher.save_pretrained(tmp_path / "teacher")
    scorer = TeacherScorer.from_config(
        TeacherConfig(pretrained_path=str(tmp_path / "teacher")), temperature=0.7
    )
    scored = scorer(_episode())
    assert [s.teacher_logprobs is not None for s in scored.segments] == [True, False, True, False]
    expected = learner_logprobs(teacher, scored, temperature=0.7)
    assert float((torch.tensor(scored.teacher_logprobs) - expected).abs().max()) <= 1e-5
    assert scored.tokens == _episode().tokens and scored.sampling_logprobs == _episode().sampling_logprobs


def test_the_teacher_scores_the_episode_up_to_its_last_action_and_nothing_without_actions():
    episode = _episode()
    trailing = Trajectory("t1", "g0", 0, episode.prompt, (*episode.segments, Segment((7, 8), False)), 0, 2,
                          "length", 0.0, 0.0)  # fmt: skip
    assert teacher_input(trailing) == teacher_input(episode) == episode.tokens  # the last answer is left out
    assert len(trailing.tokens) == len(episode.tokens) + 2
    silent = Trajectory("t2", "g0", 0, (12, 2), (Segment((9,), False),), 0, 0, "failure", 0.0, 0.0)
    assert teacher_input(silent) is None and TeacherScorer(None, 1.0)(silent) is silent


def test_a_teacher_with_another_vocabulary_is_refused_at_set_up_naming_both_sizes(tmp_path):
    spec = toy_model_spec()
    wide = TeacherConfig(model_type="qwen3", config={**spec.config, "vocab_size": 32})
    with pytest.raises(ConfigError, match="teacher's vocabulary has 32 tokens and the student's 16"):
        EmbeddedEngineConfig(teacher=wide).build(spec, GuessingGameTasks(latency="none"))
    ckpt = _checkpoint(
        tmp_path / "wide.ckpt", random_model(spec, 0), config={**spec.config, "vocab_size": 20}
    )
    with pytest.raises(ConfigError, match="teacher's vocabulary has 20 tokens and the student's 16"):
        EmbeddedEngineConfig(teacher=TeacherConfig(ckpt_path=ckpt)).build(
            spec, GuessingGameTasks(latency="none")
        )


def test_unusable_teacher_configurations_are_refused_with_the_reason(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of pretrained_path, ckpt_path, model_type"):
        TeacherConfig(pretrained_path="a", ckpt_path="b")
    with pytest.raises(ConfigError, match="exactly one of .* \\(got none\\)"):
        TeacherConfig()
    with pytest.raises(ConfigError, match="no such file"):
        load_teacher(TeacherConfig(ckpt_path=str(tmp_path / "missing.ckpt")))
    lora = _checkpoint(tmp_path / "lora.ckpt", random_model(toy_model_spec(), 0), lora={"r": 8})
    with pytest.raises(ConfigError, match="is a LoRA checkpoint"):
        load_teacher(TeacherConfig(ckpt_path=lora))
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="not a readable Lightning checkpoint"):
        load_teacher(TeacherConfig(ckpt_path=str(tmp_path / "junk.ckpt")))
