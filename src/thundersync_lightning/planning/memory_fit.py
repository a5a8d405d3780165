"""Whether a memory plan fits a machine, and which settings would make it fit.

:func:`suggestions` re-plans variants of the inputs: first single changes (the largest
``max_batch_trajectories`` / ``max_held_trajectories`` / ``max_open_groups`` / ``max_batch_tokens`` that fits,
the split backward off, offload, LoRA, ZeRO-1 or FSDP2 over the fewest GPUs), and only when none fits alone,
the tightest bounds with offload and LoRA together, then the longest trajectory that would fit with them.
Every suggestion names the YAML key (``trainer.strategy.init_args.*``, ``model.lora.r``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .sizes import format_bytes

if TYPE_CHECKING:  # annotations only: the planner calls this module, not the other way round
    from .memory_plan import MemoryPlan, PlanInputs

__all__ = ["Verdict", "suggestions", "HOST_UNCHECKED"]

#: The LoRA rank a plan suggests (LoraSettings' default).
_LORA_RANK = 8


#: A host capacity that stands for "not checked" (planning for a machine whose RAM was not given).
HOST_UNCHECKED = 1 << 62


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a plan fits a machine, and single settings (or one combination) that would make it fit."""

    fits: bool
    device_needed: int
    device_available: int
    host_needed: int
    host_available: int
    suggestions: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.fits

    def message(self) -> str:
        host = f"host: needs {format_bytes(self.host_needed)} of {format_bytes(self.host_available)}"
        if self.host_available >= HOST_UNCHECKED:
            host = f"host: needs {format_bytes(self.host_needed)} (not checked)"
        if self.device_available or self.device_needed:
            host = (
                f"device: needs {format_bytes(self.device_needed)} of "
                f"{format_bytes(self.device_available)}; {host}"
            )
        lines = [host]
        if not self.fits:
            if self.suggestions:
                lines.append("any of these would make it fit: " + "; ".join(self.suggestions))
            else:
                lines.append("no setting in reach makes it fit: use a smaller model or more devices")
        return "\n".join(lines)


def suggestions(
    i: PlanInputs, device: int, host: int, plan: Callable[[PlanInputs], MemoryPlan]
) -> tuple[str, ...]:
    """Settings that make the plan fit: single changes first, else the first combination that does.

    ``plan`` is the planner (:func:`~.memory_plan.plan_memory`) that re-plans each variant."""

    def fits(x: PlanInputs) -> bool:
        return plan(x).fits_bytes(device, host)

    out: list[str] = []
    strategy = "trainer.strategy.init_args"
    for name in ("max_batch_trajectories", "max_held_trajectories", "max_open_groups"):
        current = getattr(i, name)
        upper = current - 1 if current is not None else _natural_bound(i, name)
        lowest = 0 if name == "max_held_trajectories" else 1  # 0 held: every backward waits for its reward
        best = next((k for k in range(upper, lowest - 1, -1) if fits(replace(i, **{name: k}))), None)
        if best is not None:
            out.append(f"{strategy}.{name}={best}")
    tokens = _largest_token_cap(i, fits)
    if tokens is not None:
        out.append(f"{strategy}.max_batch_tokens={tokens}")
    if i.call_destinations and fits(replace(i, call_destinations=0)):
        out.append(f"{strategy}.split_backward=false (one backward per destination)")
    if i.offload == "none" and i.mode != "sync":
        for where in ("pinned", "cpu") if i.accelerator == "gpu" else ():
            if fits(replace(i, offload=where)):
                out.append(f"{strategy}.offload={where}")
                break
    lora = not i.model.lora and i.model.lora_params_per_rank > 0
    lora_inputs = replace(i, model=i.model.with_lora(_LORA_RANK), reference=False) if lora else i
    if lora and fits(lora_inputs):
        out.append(f"model.lora.r={_LORA_RANK} (LoRA: only adapters train)")
    if i.accelerator == "gpu":
        for sharding in ("zero1", "fsdp2"):
            if i.sharding == sharding:
                continue
            for n in sorted({max(i.world_size, 1), 2, 4, 8}):
                if n >= i.world_size and fits(replace(i, sharding=sharding, world_size=n)):
                    devices = "" if n == i.world_size else f" over {n} GPUs (trainer.devices={n})"
                    out.append(f"{strategy}.sharding={sharding}{devices}")
                    break
    if out:
        return tuple(out)
    tight = replace(i, max_open_groups=1, max_held_trajectories=0, max_batch_trajectories=1)
    combos = [("", tight)]
    if lora:
        combos.append(
            (f"model.lora.r={_LORA_RANK}, ", replace(tight, model=lora_inputs.model, reference=False))
        )
    offloads = ("pinned", "none") if i.accelerator == "gpu" and i.mode != "sync" else (i.offload,)
    candidates = [
        (label, where, replace(base, offload=where)) for label, base in combos for where in offloads
    ]
    together = (
        f"together: {{}}{strategy}.max_open_groups=1, max_held_trajectories=0, max_batch_trajectories=1, "
    )
    for label, where, x in candidates:
        if fits(x):
            return (together.format(label) + f"offload={where}",)
    for label, where, x in candidates:  # activations of long trajectories: the context limit decides
        t = x.max_tokens_per_trajectory // 2
        while t >= 256 and not fits(replace(x, max_tokens_per_trajectory=t)):
            t //= 2
        if t >= 256:
            return (
                together.format(label) + f"offload={where} and trajectories of at most {t} tokens "
                "(the engine's context limit, e.g. data.engine.init_args.max_model_len)",
            )
    return ()


def _largest_token_cap(i: PlanInputs, fits: Callable[[PlanInputs], bool]) -> int | None:
    """The largest ``max_batch_tokens`` below the current one (or below the row cap's tokens) that
    fits, rounded down to a multiple of 256 above 512; None when even one trajectory per call does
    not fit or the scorer's padding is unknown (the cap then bounds nothing)."""
    if i.score_max_padding is None:
        return None
    upper = (i.max_batch_tokens or i.max_batch_trajectories * i.max_tokens_per_trajectory) - 1
    low, high = 1, upper
    if high < low or not fits(replace(i, max_batch_tokens=low)):
        return None
    while low < high:  # the plan grows with the cap: the largest that fits
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(replace(i, max_batch_tokens=mid)) else (low, mid - 1)
    return low // 256 * 256 if low >= 512 else low


def _natural_bound(i: PlanInputs, name: str) -> int:
    """The largest value of an unbounded limit that still changes the plan."""
    if name == "max_open_groups":
        return i.groups_on_rank - 1
    return i.open_groups * i.group_size - 1  # max_held_trajectories
