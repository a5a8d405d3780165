"""The teacher of on-policy distillation, scored inside the rollout engine (off the learner's path).

Notation: a finished trajectory is tokens x_1..x_T (prompt, then scored actions and unscored
observations); the teacher's logits z' at position t-1 give

    p_t = log_softmax(z'_{t-1} / T)[x_t]        at every scored t (float32)

with T the engine's sampling temperature, the same distribution the learner scores the student
at. One forward of the episode (up to its last action) per trajectory, in the generation
process, before its ContentReady: the learner receives p in ``Segment.teacher_logprobs`` and
does no extra work (``Objective(opd_coef=...)`` turns it into the per-token advantage
-(l_t - p_t)).

A teacher is configured on the engine with :class:`TeacherConfig`: a local Hugging Face
directory (``pretrained_path``), a Lightning checkpoint of this project (``ckpt_path``: its
``hyper_parameters`` give the architecture, its ``state_dict`` keys ``model.*`` the weights;
read with ``torch.load``, no Lightning import) or, for tests, a random ``model_type``/``config``.
Its vocabulary must equal the student's: :func:`check_teacher` raises a ConfigError at set-up,
before the generation process starts.

:class:`TeacherScorer` is the transformers scorer of the embedded engine; the vLLM engine scores
with a second vLLM engine instead (:mod:`.vllm.teacher`). Both go through :func:`teacher_input`
and :func:`with_teacher_logprobs`, so ``Segment.teacher_logprobs`` has one layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..core.errors import ConfigError
from ..core.types import ModelSpec, Trajectory
from .hf_model import build_model
from .sampling import temperature_logprobs

__all__ = [
    "TeacherConfig",
    "TeacherScorer",
    "check_teacher",
    "load_teacher",
    "teacher_input",
    "teacher_spec",
    "vocab_size",
    "with_teacher_logprobs",
]

_MODEL_PREFIX = "model."


@dataclass(frozen=True, slots=True)
class TeacherConfig:
    """Where the teacher comes from: exactly one of ``pretrained_path``, ``ckpt_path``, ``model_type``.

    Attributes:
        pretrained_path: a local Hugging Face model directory (``from_pretrained``, offline).
        ckpt_path: a Lightning checkpoint written by training a ``GRPOPolicy`` (e.g.
            ``runs/demo/checkpoints/last.ckpt``); LoRA checkpoints are not supported.
        model_type, config: a randomly initialised ``transformers`` model (tests), drawn from
            ``seed`` so that every engine process builds the same teacher.
        dtype: parameter dtype (default: the checkpoint's, else float32).
        seed: the seed of a randomly initialised teacher.
    """

    pretrained_path: str | None = None
    ckpt_path: str | None = None
    model_type: str | None = None
    config: Mapping[str, Any] | None = None
    dtype: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        sources = [n for n in ("pretrained_path", "ckpt_path", "model_type") if getattr(self, n) is not None]
        problems = []
        if len(sources) != 1:
            problems.append(
                f"set exactly one of pretrained_path, ckpt_path, model_type (got {sources or 'none'})"
            )
        if self.config is not None and self.model_type is None:
            problems.append("config is only used with model_type (a randomly initialised teacher)")
        if self.dtype is not None and not isinstance(getattr(torch, self.dtype, None), torch.dtype):
            problems.append(f"dtype={self.dtype!r} is not a torch dtype")
        if problems:
            raise ConfigError("TeacherConfig is invalid: " + "; ".join(problems))


def _read_checkpoint(path: str) -> dict[str, Any]:
    if not Path(path).is_file():
        raise ConfigError(f"TeacherConfig(ckpt_path={path!r}): no such file (run `make demo` to write one)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a configuration problem
        raise ConfigError(
            f"TeacherConfig(ckpt_path={path!r}) is not a readable Lightning checkpoint: {exc}"
        ) from exc


def teacher_spec(config: TeacherConfig) -> tuple[ModelSpec, dict[str, torch.Tensor] | None]:
    """The teacher's architecture and, for a checkpoint, its weights (HF ``state_dict`` names)."""
    if config.pretrained_path is not None:
        return ModelSpec(pretrained_path=config.pretrained_path, dtype=config.dtype or "float32"), None
    if config.model_type is not None:
        return ModelSpec(config.model_type, dict(config.config or {}), dtype=config.dtype or "float32"), None
    assert config.ckpt_path is not None
    ckpt = _read_checkpoint(config.ckpt_path)
    hparams, state = ckpt.get("hyper_parameters"), ckpt.get("state_dict")
    if not isinstance(hparams, Mapping) or not isinstance(state, Mapping) or "model_type" not in hparams:
        raise ConfigError(
            f"TeacherConfig(ckpt_path={config.ckpt_path!r}) has no GRPOPolicy hyper_parameters/state_dict; "
            "pass a checkpoint written by training this project's policy, or use pretrained_path"
        )
    if hparams.get("lora") is not None:
        raise ConfigError(
            f"TeacherConfig(ckpt_path={config.ckpt_path!r}) is a LoRA checkpoint; a teacher needs full "
            "weights: export the merged model as a Hugging Face directory and use pretrained_path"
        )
    spec = ModelSpec(
        model_type=str(hparams["model_type"]),
        config=dict(hparams.get("config") or {}),
        pretrained_path=hparams.get("pretrained_path"),
        dtype=config.dtype or str(hparams.get("dtype") or "float32"),
    )
    weights = {k[len(_MODEL_PREFIX) :]: v for k, v in state.items() if k.startswith(_MODEL_PREFIX)}
    if not weights:
        raise ConfigError(
            f"TeacherConfig(ckpt_path={config.ckpt_path!r}): its state_dict has no 'model.*' weights"
        )
    return spec, weights


def vocab_size(spec: ModelSpec) -> int:
    """The vocabulary size of ``spec``'s architecture (from its config; no weights are built)."""
    from transformers import AutoConfig

    if spec.pretrained_path is not None:
        config = AutoConfig.from_pretrained(spec.pretrained_path, local_files_only=True)
    else:
        config = AutoConfig.for_model(spec.model_type, **dict(spec.config))
    return int(config.vocab_size)


def check_teacher(config: TeacherConfig, student: ModelSpec) -> None:
    """Raise ConfigError (at set-up, in the learner) unless the teacher resolves and shares the vocabulary."""
    spec, _ = teacher_spec(config)
    theirs, ours = vocab_size(spec), vocab_size(student)
    if theirs != ours:
        raise ConfigError(
            f"the teacher's vocabulary has {theirs} tokens and the student's {ours}: on-policy distillation "
            "scores the student's token ids with the teacher, so both must share one tokenizer and vocab_size"
        )


def load_teacher(config: TeacherConfig, device: str | torch.device = "cpu") -> Any:
    """The teacher model, in eval mode with frozen weights, on ``device``."""
    spec, weights = teacher_spec(config)
    with torch.random.fork_rng(devices=[]):  # a random teacher: the same in every process
        torch.manual_seed(config.seed)
        model = build_model(spec, device)
    if weights is not None:
        try:
            model.load_state_dict(weights, strict=True)
        except RuntimeError as exc:
            raise ConfigError(
                f"the teacher checkpoint's weights do not fit its own architecture: {exc}"
            ) from exc
    return model.requires_grad_(False).eval()


class TeacherScorer:
    """Fills ``teacher_logprobs`` of a trajectory's scored segments (see the module docstring).

    Args:
        model: the teacher (a ``transformers`` causal LM).
        temperature: the engine's sampling temperature T.
    """

    def __init__(self, model: Any, temperature: float) -> None:
        self.model = model
        self.temperature = temperature

    @classmethod
    def from_config(cls, config: TeacherConfig, temperature: float, device: str = "cpu") -> TeacherScorer:
        return cls(load_teacher(config, device), temperature)

    @torch.inference_mode()
    def __call__(self, trajectory: Trajectory) -> Trajectory:
        tokens = teacher_input(trajectory)
        if tokens is None:
            return trajectory
        device = next(self.model.parameters()).device
        ids = torch.tensor(tokens, dtype=torch.long, device=device).unsqueeze(0)  # (1, L)
        logits = self.model(input_ids=ids).logits[0, :-1]  # (L-1, V): position t predicts token t+1
        lp = temperature_logprobs(logits, self.temperature)  # (L-1, V)
        picked = lp.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1).tolist()  # (L-1,)
        return with_teacher_logprobs(trajectory, picked)


def teacher_input(trajectory: Trajectory) -> tuple[int, ...] | None:
    """The token ids a teacher must score: the episode up to its last scored token (None: nothing to score).

    Observations after the last action carry no teacher signal and are left out (they may also
    run past the engine's context limit: the environment's last answer is never generated on).
    """
    if trajectory.num_scored_tokens == 0:
        return None
    if not trajectory.prompt:
        raise ValueError(
            f"trajectory {trajectory.trajectory_id!r} has no prompt: its first token has no context"
        )
    end, pos = len(trajectory.prompt), len(trajectory.prompt)
    for seg in trajectory.segments:
        pos += len(seg.tokens)
        if seg.scored and seg.tokens:
            end = pos
    return trajectory.tokens[:end]


def with_teacher_logprobs(trajectory: Trajectory, picked: Sequence[float]) -> Trajectory:
    """``trajectory`` with ``Segment.teacher_logprobs`` filled on every non-empty scored segment.

    ``picked[t-1]`` is the teacher's p_t of token t of ``teacher_input(trajectory)`` (t >= 1), the
    layout of a causal LM's shifted logits and of vLLM's ``prompt_logprobs[1:]``.
    """
    segments, pos = [], len(trajectory.prompt)  # token index of the segment's first token
    for seg in trajectory.segments:
        if seg.scored and seg.tokens:
            seg = replace(
                seg, teacher_logprobs=tuple(float(p) for p in picked[pos - 1 : pos - 1 + len(seg.tokens)])
            )
        segments.append(seg)
        pos += len(seg.tokens)
    return replace(trajectory, segments=tuple(segments))
