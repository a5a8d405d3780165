"""Whether a fit splits its learner's backward by row (``ThunderSyncStrategy(split_backward=...)``).

A split backward (:mod:`~thundersync_lightning.core.split_backward`) lets one learner call span
several destinations (the step's gradient, (group, reward) sums, held gradients) at the cost of
ONE backward. It applies to streaming (sync and async send every row to the step's gradient), needs
a module whose ``score_tokens`` takes ``capture=`` and whose trainable parameters all sit in
modules that can be split, and is not combined with the boundary cut or FSDP2's sharded weights.
``"auto"`` uses it where it applies and otherwise says why at debug level; ``True`` requires it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Literal

from torch import Tensor

from ..core.errors import ConfigError
from ..core.split_backward import RowCapture, unsupported_modules

__all__ = ["SplitBackward", "split_problems", "row_capture"]

SplitBackward = bool | Literal["auto"]


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
        return None
    return RowCapture(module, params, strict=setting is True)
