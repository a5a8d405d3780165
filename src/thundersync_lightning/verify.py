"""``verify``: is a streaming step, on this model, data, precision and engine, the synchronous update?

One optimizer step is run twice from the same weights on the same trajectories:

1. ``sync`` with the configured engine, whose events (tokens, engine logprobs, rewards, completion
   times) are recorded (:mod:`thundersync_lightning.rollout.recorded`);
2. ``streaming`` on a replay of that recording, each event delivered as long after the request as
   it arrived live, so the streaming learner sees the live interleaving of content and verdicts.

Each run's gradient g is taken where the optimizer would apply it (before clipping). Reported:

    whole      ||g_stream - g_sync|| / ||g_sync||             (L2 over every trainable parameter)
    worst      max_p ||g_stream,p - g_sync,p|| / ||g_sync,p||  and the parameter p
    KL         the k3 estimate of KL(engine || learner) per scored token (StepStats.engine_learner_kl)

The check passes when ``whole`` is within the tolerance of the lowest precision in play: 1e-5 in
fp32 (summation order only), :data:`BF16_TOLERANCE` in bf16 or fp16, where each trajectory's
gradient is rounded by 16-bit autograd before it reaches the fp32 sums (docs/verify.md gives the
measurement this bound rests on). The optimizer's step after the barrier is irrelevant here.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch import Callback
from torch import Tensor
from typing_extensions import override

from .core.errors import ThunderSyncError
from .rollout.recorded import RecordedEngines, RecordingEngines

__all__ = [
    "BF16_TOLERANCE",
    "FP32_TOLERANCE",
    "GradientDifference",
    "Precision",
    "VerifyError",
    "VerifyReport",
    "gradient_difference",
    "precision_of",
    "verify_step",
]

Precision = Literal["float32", "bfloat16", "float16"]

#: fp32: the two modes differ by summation order only (~1e-7 relative measured).
FP32_TOLERANCE = 1e-5
#: bf16/fp16: a few 16-bit roundoffs (2^-8) of the step's gradient (docs/verify.md).
BF16_TOLERANCE = 3e-2

TOLERANCES: dict[Precision, float] = {
    "float32": FP32_TOLERANCE,
    "bfloat16": BF16_TOLERANCE,
    "float16": BF16_TOLERANCE,
}


class VerifyError(ThunderSyncError):
    """The check cannot conclude (e.g. the step's gradient is zero: nothing to compare)."""


def precision_of(precision: Any, dtype: torch.dtype | str | None) -> Precision:
    """The lowest float precision of a run: Lightning's ``precision`` flag or the parameters' dtype."""
    flag = str(precision or "")
    name = str(dtype or "").removeprefix("torch.")
    if flag.startswith("bf16") or name == "bfloat16":
        return "bfloat16"
    if flag.startswith("16") or name == "float16":
        return "float16"
    return "float32"


@dataclass(frozen=True, slots=True)
class GradientDifference:
    """``relative``: whole-gradient relative L2 difference; ``worst_*``: the parameter that differs most."""

    relative: float
    worst_parameter: str
    worst_relative: float
    reference_norm: float


def gradient_difference(got: Mapping[str, Tensor], want: Mapping[str, Tensor]) -> GradientDifference:
    """Relative L2 difference of ``got`` against ``want`` (same parameter names), whole and worst.

    A parameter whose reference gradient is zero but whose ``got`` is not counts as infinitely off.
    Raises :class:`VerifyError` when the names differ or the whole reference gradient is zero.
    """
    if set(got) != set(want):
        raise VerifyError(
            f"the two runs trained different parameters: only in one {sorted(set(got) ^ set(want))[:5]}"
        )
    diff_sq = ref_sq = 0.0
    worst, worst_rel = "", -1.0
    for name, ref in want.items():
        d = float((got[name].double() - ref.double()).norm())
        n = float(ref.double().norm())
        diff_sq += d * d
        ref_sq += n * n
        rel = d / n if n > 0 else (math.inf if d > 0 else 0.0)
        if rel > worst_rel:
            worst, worst_rel = name, rel
    if ref_sq == 0.0:
        raise VerifyError(
            "the sync step's gradient is zero (every group's rewards equal, or nothing was scored): "
            "nothing to compare. Use more groups (data.groups_per_step) or a task with varied rewards."
        )
    return GradientDifference(math.sqrt(diff_sq / ref_sq), worst, worst_rel, math.sqrt(ref_sq))


class _StepCapture(Callback):
    """The gradient the optimizer is about to apply (per trainable parameter, on the CPU) and the
    strategy's StepStats of that step."""

    def __init__(self) -> None:
        self.gradient: dict[str, Tensor] = {}
        self.stats: Any = None

    @override
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.gradient = {
            name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().to("cpu", copy=True)
            for name, p in pl_module.named_parameters()
            if p.requires_grad
        }

    @override
    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self.stats = getattr(trainer.strategy, "last_step_stats", None)


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What ``verify`` measured; :attr:`passed` when :attr:`difference` is within :attr:`tolerance`."""

    difference: GradientDifference
    precision: Precision
    tolerance: float
    trajectories: int
    scored_tokens: int
    engine_learner_kl: float | None  # the larger of the two runs' (None: the engine reports no logprobs)
    streaming_held: int = 0  # most gradients the streaming run held at once, waiting for their reward

    @property
    def passed(self) -> bool:
        return self.difference.relative <= self.tolerance

    def lines(self) -> list[str]:
        d = self.difference
        kl = (
            "n/a (the engine reports no logprobs)"
            if self.engine_learner_kl is None
            else f"{self.engine_learner_kl:.2e}"
        )
        verdict = "PASS" if self.passed else "FAIL"
        return [
            f"verify: one step of streaming (replayed) and of sync on the same {self.trajectories} "
            f"trajectories ({self.scored_tokens} scored tokens), {self.precision}",
            f"  gradient difference  {d.relative:.2e}  (|g_streaming - g_sync| / |g_sync|, "
            f"|g_sync| = {d.reference_norm:.3e})",
            f"  worst parameter      {d.worst_relative:.2e}  {d.worst_parameter}",
            f"  engine-learner KL    {kl}  (per scored token)",
            f"  streaming held       {self.streaming_held} trajectories' "
            "gradients at most, before their rewards",
            f"{verdict}: {d.relative:.2e} {'<=' if self.passed else '>'} "
            f"{self.tolerance:.0e} ({self.precision} tolerance)",
        ]


def verify_step(
    policy: L.LightningModule,
    data: Any,
    strategy: Callable[[str], Any],
    *,
    accelerator: str = "auto",
    precision: Any = None,
    seed: int | None = 0,
    tolerance: float | None = None,
    root_dir: str | None = None,
) -> VerifyReport:
    """One sync step on ``data``'s engine (recorded), one streaming step on its replay; compare.

    Args:
        policy: the LightningModule; both runs start from its weights as they are now (restored
            after each run; a ``*-true`` precision leaves them in that dtype, as ``fit`` does).
        data: a data module with an ``engine_factory`` (``RolloutDataModule``); swapped for a
            recording and a replay during the runs, restored after.
        strategy: ``strategy(mode)`` builds a fresh strategy for ``mode`` ("sync", "streaming").
        accelerator, precision: the Trainer's; one device, one process.
        seed: ``seed_everything`` before each run (None: leave the global seed alone).
        tolerance: pass bound on the whole relative difference (default: the precision's).
    """
    initial = {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()}
    factory = data.engine_factory
    recorder = RecordingEngines(factory)
    runs: dict[str, _StepCapture] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="thundersync-verify-") as tmp:
            for mode, engines in (("sync", recorder), ("streaming", RecordedEngines(recorder.recording))):
                policy.load_state_dict(initial)
                data.engine_factory = engines
                runs[mode] = _one_step(
                    policy, data, strategy(mode), accelerator, precision, seed, root_dir or tmp
                )
    finally:
        data.engine_factory = factory
        policy.load_state_dict(initial)
    dtype = next((p.dtype for p in policy.parameters() if p.requires_grad), None)
    kind = precision_of(precision, dtype)
    stats, streamed = runs["sync"].stats, runs["streaming"].stats
    kls = [s.engine_learner_kl for s in (r.stats for r in runs.values()) if s is not None]
    kls = [k for k in kls if k is not None]
    return VerifyReport(
        difference=gradient_difference(runs["streaming"].gradient, runs["sync"].gradient),
        precision=kind,
        tolerance=TOLERANCES[kind] if tolerance is None else tolerance,
        trajectories=len(stats.trajectories) if stats is not None else 0,
        scored_tokens=sum(t.num_scored_tokens for t in stats.trajectories) if stats is not None else 0,
        engine_learner_kl=max(kls) if kls else None,
        streaming_held=streamed.peak_held_trajectories if streamed is not None else 0,
    )


def _one_step(
    policy: L.LightningModule,
    data: Any,
    strategy: Any,
    accelerator: str,
    precision: Any,
    seed: int | None,
    root: str,
) -> _StepCapture:
    if seed is not None:
        L.seed_everything(seed, verbose=False)
    capture = _StepCapture()
    trainer = L.Trainer(
        strategy=strategy,
        accelerator=accelerator,
        devices=1,
        num_nodes=1,
        precision=precision,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=root,
        callbacks=[capture],
    )
    trainer.fit(policy, data)
    if not capture.gradient:
        raise VerifyError(
            f"the {getattr(strategy, 'mode', '')} run took no optimizer step: nothing to compare"
        )
    return capture
