"""The strategy's own options checked at construction: every problem found, named, in one message.

An option that belongs elsewhere says where it moved: the objective's fields (estimator, eps,
...) live on the LightningModule, and the DDP wrapper's options have no wrapper to act on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..core.grpo.objective import Objective
from ..core.options import trl_hint
from .sharding import SHARDINGS

__all__ = ["MODES", "option_problems"]

MODES = ("streaming", "sync", "async")
_OBJECTIVE_FIELDS = frozenset(Objective.__dataclass_fields__) | {"objective"}


def option_problems(
    options: Mapping[str, Any], unknown: Mapping[str, Any], valid: Sequence[str]
) -> list[str]:
    """Problems of ``ThunderSyncStrategy(**options, **unknown)``; ``valid``: its option names. The
    accumulator's bounds are checked where they are made (``core.accumulator.bounds.AccumulatorBounds``)."""
    problems = []
    for name in sorted(unknown):
        if name in _OBJECTIVE_FIELDS:
            problems.append(
                f"{name}={unknown[name]!r}: the objective moved to the LightningModule; use "
                f"GRPOPolicy(objective=Objective({name}=...)) or --model.objective.{name}=... (YAML: "
                f"model.objective.{name})"
            )
        else:
            problems.append(
                f"{name}={unknown[name]!r} is not an option of ThunderSyncStrategy{trl_hint(name)} (it has "
                "no DDP wrapper to "
                f"pass it to); valid options: {', '.join(valid)}"
            )
    o = options
    if o["mode"] not in MODES:
        problems.append(f"mode={o['mode']!r} is not one of {MODES}")
    if o["offload"] not in ("none", "cpu", "pinned"):
        problems.append(f"offload={o['offload']!r} is not one of ('none', 'cpu', 'pinned')")
    if o["sharding"] not in SHARDINGS:
        problems.append(f"sharding={o['sharding']!r} is not one of {tuple(SHARDINGS)}")
    rows = o["max_batch_trajectories"]
    if rows != "auto" and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        problems.append(f"max_batch_trajectories must be an integer >= 1 or 'auto', got {rows!r}")
        rows = "auto"  # reported: the check below has no bound to compare with
    least = o["min_batch_trajectories"]
    if least != "auto" and (isinstance(least, bool) or not isinstance(least, int) or least < 1):
        problems.append(f"min_batch_trajectories must be an integer >= 1 or 'auto', got {least!r}")
    elif least != "auto" and rows != "auto" and least > rows:
        problems.append(
            f"min_batch_trajectories={least} exceeds max_batch_trajectories={o['max_batch_trajectories']}: "
            "a call could never hold the rows it waits for"
        )
    wait = o["hold_after_s"]
    if wait != "auto" and (isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait >= 0):
        problems.append(f"hold_after_s must be a number of seconds >= 0 or 'auto', got {wait!r}")
    tokens = o["max_batch_tokens"]
    if tokens is not None and (isinstance(tokens, bool) or tokens < 1):
        problems.append(f"max_batch_tokens must be >= 1 or None, got {tokens!r}")
    split = o["split_backward"]
    if split not in (True, False, "auto"):
        problems.append(f"split_backward={split!r} is not one of (True, False, 'auto')")
    elif split is True and o["boundary_cut"]:
        problems.append("split_backward=True and boundary_cut=True cannot be combined (choose one)")
    if o["memory_check"] not in ("error", "warn", "off"):
        problems.append(f"memory_check={o['memory_check']!r} is not one of ('error', 'warn', 'off')")
    return problems
