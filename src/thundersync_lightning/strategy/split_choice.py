"""Whether a fit splits its learner's backward by row (``ThunderSyncStrategy(split_backward=...)``).

A split backward (:mod:`~thundersync_lightning.core.split_backward`) lets one learner call span
several destinations (the step's gradient, (group, reward) sums, held gradients) at the cost of
ONE backward. It applies to streaming (sync and async send every row to the step's gradient), needs
a module whose ``score_tokens`` takes ``capture=`` and whose trainable parameters all sit in
modules that can be split, and is not combined with the boundary cut or FSDP2's sharded weights.
``"auto"`` uses it where it applies and pays off, ``True`` requires it.

When it pays off (measured on CPU, ``benchmarks/split_backward.py``): one split call replaces a
call per destination, saving the per-call cost of a forward and a backward (kernel launches,
Python) and paying for J parameter-sized gradients held at once. On CPU the toy policy (0.15M
parameters) gained 1.5-1.7x; a 2.4M-parameter Qwen3 lost 7-16% (its J gradients no longer fit the
cache). ``"auto"`` therefore splits only up to :data:`AUTO_MAX_PARAMS` trainable parameters, on
any device. On a GPU small calls cost kernel launches rather than bytes, so larger models may
gain there too, but that is not measured yet (no GPU was lent; ``benchmarks/gpu_check.sh`` runs
``split_backward.py --device cuda`` on 0.15M-0.18B models): pass ``True`` to split them. Its
memory, one gradient per destination of a call, is in the memory plan. Every split call holds
at most :func:`max_destinations` gradients
(:data:`CALL_GRADIENT_BYTES` in all).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any, Literal

from torch import Tensor

from ..core.errors import ConfigError
from ..core.split_backward import RowCapture, unsupported_modules

__all__ = [
    "SplitBackward",
    "split_problems",
    "row_capture",
    "max_destinations",
    "planned_destinations",
    "auto_splits",
    "AUTO_MAX_PARAMS",
]

log = logging.getLogger(__name__)

SplitBackward = bool | Literal["auto"]
AUTO_MAX_PARAMS = 1_000_000
CALL_GRADIENT_BYTES = 2 * 2**30


def max_destinations(params: Sequence[Tensor]) -> int:
    """Destinations one split call may span: its gradients (one per destination) within
    :data:`CALL_GRADIENT_BYTES`, and never fewer than two."""
    return destinations_within(sum(p.numel() * p.element_size() for p in params))


def destinations_within(gradient_bytes: int) -> int:
    return max(2, CALL_GRADIENT_BYTES // max(1, gradient_bytes))


def auto_splits(trainable_params: int) -> bool:
    """Whether ``"auto"`` splits a module that supports it (module docstring)."""
    return trainable_params <= AUTO_MAX_PARAMS


def planned_destinations(
    setting: SplitBackward, mode: str, boundary_cut: bool, sharding: str, trainable_params: int, param_bytes: int
) -> int:
    """For the memory plan: 0 where the fit will not split, else the most destinations one split
    call may span (:func:`destinations_within`; the plan also caps it by the call's trajectories)."""
    if setting is False or mode != "streaming" or boundary_cut or sharding == "fsdp2":
        return 0
    if setting == "auto" and not auto_splits(trainable_params):
        return 0
    return destinations_within(trainable_params * param_bytes)


def split_problems(module: Any, params: Sequence[Tensor], mode: str, boundary_cut: bool, sharding: str) -> list[str]:
    """Why this fit cannot split its backward (empty: it can)."""
    problems = []
    if mode != "streaming":
        problems.append(f"mode={mode!r} sends every trajectory to the step's gradient (nothing to split)")
    if boundary_cut:
        problems.append("boundary_cut=True backpropagates each group's prompt separately")
    if sharding == "fsdp2":
        problems.append("sharding='fsdp2' gathers and frees the weights inside the forward")
    score = getattr(module, "score_tokens", None)
    if score is None or "capture" not in inspect.signature(score).parameters:
        problems.append(f"{type(module).__name__}.score_tokens takes no capture= (see GRPOPolicy.score_tokens)")
    return problems + unsupported_modules(module, params)


def row_capture(
    setting: SplitBackward, module: Any, params: Sequence[Tensor], mode: str, boundary_cut: bool, sharding: str
) -> RowCapture | None:
    """The capture a fit's runner splits with, or None; ``setting=True`` raises where it cannot."""
    if setting is False:
        return None
    problems = split_problems(module, params, mode, boundary_cut, sharding)
    if problems and setting is True and mode == "streaming":
        raise ConfigError("split_backward=True cannot be used: " + "; ".join(problems))
    if problems:
        if mode == "streaming":  # the only mode that would split: say why it does not
            log.info("split_backward='auto' leaves the split off: %s", "; ".join(problems))
        return None
    size = sum(p.numel() for p in params)
    if setting == "auto" and not auto_splits(size):
        # measured slower on CPU at this size, not measured on a GPU (module docstring)
        log.info(
            "split_backward='auto' leaves the split off: %d trainable parameters > %d (slower on CPU; "
            "pass split_backward=True to split, e.g. on a GPU)", size, AUTO_MAX_PARAMS,
        )
        return None
    return RowCapture(module, params, strict=setting is True)
