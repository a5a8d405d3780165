"""Which backward backend a fit uses (``ThunderSyncStrategy(split_backward="auto" | True | False)``).

The split backward (:class:`~.backend.SplitBackend`) lets one learner call span several
destinations (the step's gradient, (group, reward) sums, held gradients) at the cost of ONE
backward. It applies to streaming (sync and async send every row to the step's gradient), needs a
module whose ``score_tokens`` takes ``watch=``
(:class:`~thundersync_lightning.core.gradients.backward.ForwardWatch`) and whose trainable parameters all sit
in modules that can be split, and is not combined with the boundary cut or FSDP2's sharded weights. ``False``
is the plain backend, ``True`` requires the split, ``"auto"`` uses it where it applies and up to
:data:`AUTO_MAX_PARAMS` trainable
parameters: the range where ``benchmarks/results/split_backward.json`` (written by
``benchmarks/split_backward.py``) shows a gain on CPU. One split call replaces a call per
destination (a forward and a backward each) and holds one parameter-sized gradient per
destination, at most :func:`~.backend.max_destinations` of them. On a GPU the same benchmark
(``benchmarks/results/gpu/split_backward/split_backward.json``, from ``benchmarks/gpu_check.sh``)
gains up to its largest model (184M); the cap stays until a fit at a user's scale measures it:
pass ``True`` to split larger models. The memory plan counts those gradients
(:func:`planned_destinations`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any, Literal

from torch import Tensor

from ...core.errors import ConfigError
from ...core.gradients.backward import BackwardBackend, PlainBackward
from .backend import SplitBackend, destinations_within
from .backward import unsupported_modules

__all__ = [
    "SplitSetting",
    "split_problems",
    "choose_backend",
    "planned_destinations",
    "auto_splits",
    "AUTO_MAX_PARAMS",
]

log = logging.getLogger(__name__)

#: ``ThunderSyncStrategy(split_backward=...)``.
SplitSetting = bool | Literal["auto"]
AUTO_MAX_PARAMS = 1_000_000


def auto_splits(trainable_params: int) -> bool:
    """Whether ``"auto"`` splits a module that supports it (module docstring)."""
    return trainable_params <= AUTO_MAX_PARAMS


def planned_destinations(
    setting: SplitSetting,
    mode: str,
    boundary_cut: bool,
    sharding: str,
    trainable_params: int,
    param_bytes: int,
) -> int:
    """For the memory plan: 0 where the fit will not split, else the most destinations one split
    call may span (:func:`destinations_within`; the plan also caps it by the call's trajectories)."""
    if setting is False or mode != "streaming" or boundary_cut or sharding == "fsdp2":
        return 0
    if setting == "auto" and not auto_splits(trainable_params):
        return 0
    return destinations_within(trainable_params * param_bytes)


def split_problems(
    module: Any, params: Sequence[Tensor], mode: str, boundary_cut: bool, sharding: str
) -> list[str]:
    """Why this fit cannot split its backward (empty: it can)."""
    problems = []
    if mode != "streaming":
        problems.append(f"mode={mode!r} sends every trajectory to the step's gradient (nothing to split)")
    if boundary_cut:
        problems.append("boundary_cut=True backpropagates each group's prompt separately")
    if sharding == "fsdp2":
        problems.append("sharding='fsdp2' gathers and frees the weights inside the forward")
    score = getattr(module, "score_tokens", None)
    taken = inspect.signature(score).parameters if score is not None else {}
    if "watch" not in taken:
        renamed = " (its capture= keyword is now called watch=)" if "capture" in taken else ""
        problems.append(
            f"{type(module).__name__}.score_tokens takes no watch= (see GRPOPolicy.score_tokens){renamed}"
        )
    return problems + unsupported_modules(module, params)


def choose_backend(
    setting: SplitSetting, module: Any, params: Sequence[Tensor], mode: str, boundary_cut: bool, sharding: str
) -> BackwardBackend:
    """The backend a fit's accumulator uses: a :class:`~.backend.SplitBackend` where ``setting``
    asks for the split and it applies, else the plain one; ``setting=True`` raises where it cannot."""
    if setting is False:
        return PlainBackward()
    problems = split_problems(module, params, mode, boundary_cut, sharding)
    if problems and setting is True and mode == "streaming":
        raise ConfigError("split_backward=True cannot be used: " + "; ".join(problems))
    if problems:
        if mode == "streaming":  # the only mode that would split: say why it does not
            log.info("split_backward='auto' leaves the split off: %s", "; ".join(problems))
        return PlainBackward()
    size = sum(p.numel() for p in params)
    if setting == "auto" and not auto_splits(size):
        log.info(
            "split_backward='auto' leaves the split off: %d trainable parameters > %d (slower on CPU; "
            "pass split_backward=True to split, e.g. on a GPU)",
            size,
            AUTO_MAX_PARAMS,
        )
        return PlainBackward()
    return SplitBackend(module, params, strict=setting is True)
