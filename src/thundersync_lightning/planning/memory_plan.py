"""The learner's memory plan: bytes per buffer, per rank, before anything is allocated.

Notation (one learner rank): P the parameter count, P_t the trainable count (adapters only with
LoRA), e the bytes of one weight (2 for bf16, 4 for fp32), a the bytes of one accumulator float
(4: sums are fp32 even for bf16 weights; 8 for float64 weights), S the optimizer's state tensors
per parameter (AdamW 2, SGD with momentum 1, plain SGD 0), N the world size, G the group size,
O the open groups and H the held (reward-pending) trajectories of a rank at once.

    weights          P e                       (fsdp2: P e / N shards + P e gathered once per step)
    reference copy   P e                       (kl_coef != 0 without LoRA: a frozen full copy)
    gradients        P_t e                     (fsdp2: / N)
    optimizer state  S P_t e                   (torch keeps it in the weights' dtype; zero1, fsdp2: / N)
    group sums       (min(2, G-1) + X) O P_t a (one running sum per distinct reward, at most two,
                                               per open group; 0 in sync mode; X more per group:
                                               dynamic sampling's R sum, the flagged sums of
                                               off_policy_mask, planned at G; with the held
                                               gradients at most G dense buffers per group)
    held gradients   H P_t a                   (one per reward-pending trajectory; 0 in sync mode;
                                               2 H P_t a when failed="drop" keeps R_i apart too)
    step gradient    P_t a                     (the folded gradient; a second under scale="batch"
                                                with regulariser terms)
    staging          2 P_t a                   (offload on a GPU: double-buffered device copies)
    landing          2 P_t a                   (pinned offload: the host buffers copies land in)
    backward         D P_t e                   (autograd results before they are added: D = 1, or
                                               the destinations of one split-backward call)
    collective       P_t e                     (N > 1: the flat all-reduce / reduce-scatter buffer)
    weight sync      k max(B, W_max)           (vLLM ``weight_sync`` ipc/nccl: bucket size B, largest
                                               tensor W_max = max(V, I) h e; k = 2 for ipc, the
                                               learner's bucket and the engine's copy on the same
                                               device; k = 1 for nccl, the learner's bucket)
    activations      n T (L b_layer + b_logits) (the largest scored micro-batch, see below)

The accumulator rows are bounds the runtime enforces, and true worst cases: a sum or held buffer
exists only for a scored member of a group not yet folded (it folds once every member is scored
and every verdict is in): at most ``min(2, G - 1)`` sums, and ``min(2 + h, G)`` buffers with ``h``
held. The runner holds a gradient only when nothing reward-known waits and its queue is empty,
and fills a partial group's sums only when no group is complete: both rows are reached when
verdicts land after their content by more than a learner call (coding agents: tests run after the
last turn) and groups finish spread out; when verdicts land with their content and groups arrive
whole, only the step gradient is used (the direct path). Set ``max_open_groups`` and
``max_held_trajectories`` to bound the rows.

Group sums and held gradients live where ``offload`` puts them (device, pinned or pageable
host); everything else on the device. On a CPU run the device *is* the host: every row is host
memory. An unbounded ``max_open_groups`` is planned at every group of the step on the rank and
an unbounded ``max_held_trajectories`` at every trajectory of the open groups (the worst case the
accumulator can reach); the table says so.

Activations (no activation checkpointing, SDPA attention, a Qwen3/Llama decoder; h hidden, I
intermediate, q and k the query and key/value widths, V the vocabulary), saved for backward per
token:

    b_layer  = 2 (4 + e) h          two RMSNorms (fp32 input copy + normalised output)
             + (4 + e)(q + k)        per-head q/k RMSNorms
             + e (q + 2k)            q, k, v projections
             + e (2q + 2k)           attention inputs after RoPE and its output
             + 4 e I                 SwiGLU: gate, up, silu(gate), product (3 e I when LoRA
                                     leaves down_proj frozen: its input is not saved)
    b_logits = V (e + 8) (+ 8 V with an entropy term: softmax and its product)

An estimate in the spirit of Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", Sec. 4.1), adapted to SwiGLU, grouped-query attention and fp32 norms.
A call is ``max_batch_trajectories`` trajectories of ``max_tokens_per_trajectory`` tokens, fewer
padded tokens under ``max_batch_tokens`` (:mod:`~thundersync_lightning.planning.call_tokens`: the
policy keeps the graph of every micro-batch of a call until its backward).

The rows are added: a bound on the peak, not a simulation (gradients and activations are not
alive at the same moment, but the accumulator's buffers stay allocated between steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from ..core.accumulator.bounds import bound_problems
from ..core.errors import ConfigError
from ..core.gradients.storage import Offload
from .call_tokens import call_padded_tokens
from .memory_fit import Verdict, suggestions
from .model_shape import Architecture, ModelShape
from .sizes import format_bytes, parse_bytes

__all__ = [
    "Architecture",
    "ModelShape",
    "PlanInputs",
    "PlanRow",
    "MemoryPlan",
    "Sharding",
    "OptimizerKind",
    "OPTIMIZER_STATES",
    "plan_memory",
    "auto_batch_trajectories",
    "FIXED_BATCH_TRAJECTORIES",
    "parse_bytes",
    "format_bytes",
]

Sharding = Literal["none", "zero1", "fsdp2"]
OptimizerKind = Literal["adamw", "adam", "sgd", "sgd_momentum"]
#: State tensors the optimizer keeps per trainable parameter.
OPTIMIZER_STATES: dict[str, int] = {"adamw": 2, "adam": 2, "sgd_momentum": 1, "sgd": 0}
_SHARDINGS = ("none", "zero1", "fsdp2")
_OFFLOADS = ("none", "cpu", "pinned")
#: ``max_batch_trajectories="auto"``'s floor where the plan is only a worst case (nothing but the
#: model's context window bounds a trajectory) or has no activation rows (unknown architecture):
#: the fixed default the option had before "auto".
FIXED_BATCH_TRAJECTORIES = 32
_MODES = ("streaming", "sync", "async")


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """Everything a plan depends on (see the module docstring for the symbols).

    Args:
        model: the policy's shape.
        optimizer: ``adamw`` | ``adam`` | ``sgd`` | ``sgd_momentum``.
        accelerator: ``gpu`` (device rows on the device) or ``cpu`` (everything on the host).
        world_size: data-parallel learner ranks N.
        sharding: ``none`` (replicated), ``zero1`` (optimizer state / N), ``fsdp2`` (weights at
            rest, gradients and optimizer state / N; weights gathered once per step).
        offload: where group sums and held gradients live.
        mode: the strategy's mode; ``sync`` scores after the last event (no sums, nothing held).
        max_open_groups, max_held_trajectories: the accumulator's bounds (None: unbounded).
        groups_per_step, group_size: the batch (over all ranks; a rank holds its share).
        max_tokens_per_trajectory: T, the longest trajectory (context limit).
        tokens_bounded: False when nothing but the model's context window bounds T (no engine
            context limit, no task bound): the activation rows are then a worst case, not a plan.
        max_batch_trajectories: n, trajectories scored in one call.
        max_batch_tokens: the most tokens of one call (None: no token bound).
        score_max_padding, score_forward_tokens: the scorer's padding rule (``GRPOPolicy``'s
            options of these names; None: unknown, so ``max_batch_tokens`` cannot bound padding).
        max_prompt_tokens: the longest shared prompt (boundary cut; None: T).
        boundary_cut: a group's prompt graph and leaf sums stay alive while the group is open.
        reference: a frozen full copy of the weights for the KL term (kl_coef != 0 without LoRA).
        entropy: the objective has an entropy term (more logits activations).
        regulariser_buffer: a second step gradient (scale="batch" with KL/entropy/OPD terms).
        group_extra_buffers: X, parameter-sized buffers per open group beyond the two sums (dynamic
            sampling with R terms: 1; ``off_policy_mask``: up to one per distinct reward, G).
        held_regulariser: a held trajectory also holds its regulariser gradient
            (``failed="drop"`` with KL/entropy/OPD terms: it is dropped with a failed verdict).
        teacher_params, teacher_on_device: an OPD teacher held by a rollout engine (0: none).
        engine_device_fraction: the share of the device a colocated engine reserves (vLLM's
            ``gpu_memory_utilization``); engine_device_bytes: bytes it reserves instead.
        accumulator_bytes: a (4, or 8 for float64 weights).
        device_overhead_bytes: the CUDA context and allocator slack (a fixed estimate).
        weight_sync_buckets, weight_sync_bucket_bytes: buckets of a bucketed vLLM publish that
            sit on this device at once (k of the docstring; 0: no bucketed transport) and B.
        call_destinations: the most destinations one learner call's backward delivers at once
            (0: one at a time, the plain backward; else its cap, e.g. the split backward's bytes
            cap): such a call holds one gradient per destination, at most one per trajectory of a
            call plus the R terms'.
    """

    model: ModelShape
    optimizer: OptimizerKind = "adamw"
    accelerator: Literal["gpu", "cpu"] = "gpu"
    world_size: int = 1
    sharding: Sharding = "none"
    offload: Offload = "none"
    mode: Literal["streaming", "sync", "async"] = "streaming"
    max_open_groups: int | None = None
    max_held_trajectories: int | None = None
    groups_per_step: int = 16
    group_size: int = 8
    max_tokens_per_trajectory: int = 4096
    tokens_bounded: bool = True
    max_batch_trajectories: int = 32
    max_batch_tokens: int | None = None
    score_max_padding: float | None = None
    score_forward_tokens: int = 0
    max_prompt_tokens: int | None = None
    boundary_cut: bool = False
    reference: bool = False
    entropy: bool = False
    regulariser_buffer: bool = False
    held_regulariser: bool = False
    group_extra_buffers: int = 0
    teacher_params: int = 0
    teacher_on_device: bool = False
    engine_device_fraction: float = 0.0
    engine_device_bytes: int = 0
    accumulator_bytes: int = 4
    device_overhead_bytes: int = 0
    call_destinations: int = 0
    weight_sync_buckets: int = 0
    weight_sync_bucket_bytes: int = 0

    def __post_init__(self) -> None:
        problems = []
        if self.optimizer not in OPTIMIZER_STATES:
            problems.append(f"optimizer={self.optimizer!r} is not one of {tuple(OPTIMIZER_STATES)}")
        if self.sharding not in _SHARDINGS:
            problems.append(f"sharding={self.sharding!r} is not one of {_SHARDINGS}")
        if self.offload not in _OFFLOADS:
            problems.append(f"offload={self.offload!r} is not one of {_OFFLOADS}")
        if self.mode not in _MODES:
            problems.append(f"mode={self.mode!r} is not one of {_MODES}")
        if self.accelerator not in ("gpu", "cpu"):
            problems.append(f"accelerator={self.accelerator!r} is not 'gpu' or 'cpu'")
        if self.offload == "pinned" and self.accelerator == "cpu":
            problems.append(
                "offload='pinned' needs a GPU (page-locked memory); use offload='cpu' on a CPU run"
            )
        for name in (
            "world_size",
            "groups_per_step",
            "group_size",
            "max_tokens_per_trajectory",
            "max_batch_trajectories",
            "accumulator_bytes",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        problems += bound_problems(self.max_open_groups, self.max_held_trajectories)  # the accumulator's rule
        for name in ("max_prompt_tokens", "max_batch_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name} must be >= 1 or None, got {value}")
        if self.score_max_padding is not None and not self.score_max_padding >= 0:
            problems.append(f"score_max_padding must be >= 0 or None, got {self.score_max_padding}")
        if self.score_forward_tokens < 0:
            problems.append(f"score_forward_tokens must be >= 0, got {self.score_forward_tokens}")
        if not 0.0 <= self.engine_device_fraction < 1.0:
            problems.append(f"engine_device_fraction must be in [0, 1), got {self.engine_device_fraction}")
        if self.model.trainable_params > self.model.total_params:
            problems.append("model.trainable_params exceeds model.total_params")
        if problems:
            raise ConfigError("PlanInputs: " + "; ".join(problems))

    @property
    def groups_on_rank(self) -> int:
        return math.ceil(self.groups_per_step / self.world_size)

    @property
    def open_groups(self) -> int:
        """O: at most every group of the rank's share of the step."""
        bound = self.max_open_groups if self.max_open_groups is not None else self.groups_on_rank
        return min(bound, self.groups_on_rank)

    @property
    def held_trajectories(self) -> int:
        """H: at most every trajectory of the open groups."""
        worst = self.open_groups * self.group_size
        return worst if self.max_held_trajectories is None else min(self.max_held_trajectories, worst)

    @property
    def sum_buffers(self) -> int:
        """Dense reward sums over the open groups (module docstring: at most ``min(2, G - 1)`` per
        group, and with the held gradients at most ``G`` buffers per group)."""
        per_group = min(2, self.group_size - 1)
        return max(
            0, min(per_group * self.open_groups, self.open_groups * self.group_size - self.held_trajectories)
        )


@dataclass(frozen=True, slots=True)
class PlanRow:
    """One buffer kind: its bytes by location and how it was sized."""

    name: str
    device: int = 0
    pinned_host: int = 0
    pageable_host: int = 0
    note: str = ""

    @property
    def total(self) -> int:
        return self.device + self.pinned_host + self.pageable_host


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """The rows of one rank's plan (see the module docstring) and the verdict against a machine."""

    inputs: PlanInputs
    rows: tuple[PlanRow, ...] = field(default_factory=tuple)

    @property
    def device_bytes(self) -> int:
        return sum(r.device for r in self.rows)

    @property
    def pinned_host_bytes(self) -> int:
        return sum(r.pinned_host for r in self.rows)

    @property
    def pageable_host_bytes(self) -> int:
        return sum(r.pageable_host for r in self.rows)

    @property
    def host_bytes(self) -> int:
        return self.pinned_host_bytes + self.pageable_host_bytes

    def row(self, name: str) -> PlanRow:
        return next(r for r in self.rows if r.name == name)

    def bytes_of(self, *names: str) -> int:
        """Total bytes of the named rows (all locations)."""
        return sum(self.row(n).total for n in names)

    def engine_reserve(self, device_capacity: int) -> int:
        """Device bytes a colocated engine takes of ``device_capacity``."""
        i = self.inputs
        return int(i.engine_device_fraction * device_capacity) + i.engine_device_bytes

    def fits(self, device_bytes: int, host_bytes: int) -> Verdict:
        """Does the plan fit ``device_bytes`` per device (less the engine's share) and ``host_bytes``?

        When it does not, the settings of :func:`~.memory_fit.suggestions` that would fit are named.
        """
        needed = self._needs(device_bytes, host_bytes)
        ok = needed[0] <= needed[1] and needed[2] <= needed[3]
        found = () if ok else suggestions(self.inputs, device_bytes, host_bytes, plan_memory)
        return Verdict(ok, *needed, suggestions=found)

    def _needs(self, device_bytes: int, host_bytes: int) -> tuple[int, int, int, int]:
        if self.inputs.accelerator == "cpu":  # the device is the host
            return 0, 0, self.device_bytes + self.host_bytes, host_bytes
        return (
            self.device_bytes,
            device_bytes - self.engine_reserve(device_bytes),
            self.host_bytes,
            host_bytes,
        )

    def fits_bytes(self, device_bytes: int, host_bytes: int) -> bool:
        """The verdict alone (no suggestions searched)."""
        d, d_cap, h, h_cap = self._needs(device_bytes, host_bytes)
        return d <= d_cap and h <= h_cap

    def table(self) -> str:
        """The rows as a fixed-width table with totals, then how the bounds were planned."""
        i = self.inputs
        cpu = i.accelerator == "cpu"
        head = ("", "device (= host)" if cpu else "device", "pinned host", "pageable host", "")
        lines = [f"{head[0]:<18} {head[1]:>14} {head[2]:>12} {head[3]:>14}  sized as"]
        for r in self.rows:
            lines.append(
                f"{r.name:<18} {format_bytes(r.device):>14} {format_bytes(r.pinned_host):>12} "
                f"{format_bytes(r.pageable_host):>14}  {r.note}"
            )
        lines.append(
            f"{'total':<18} {format_bytes(self.device_bytes):>14} {format_bytes(self.pinned_host_bytes):>12} "
            f"{format_bytes(self.pageable_host_bytes):>14}"
        )
        m = i.model
        lines.append(
            f"sized as: P = {m.total_params:,} parameters, P_t = {m.trainable_params:,} trainable, e = "
            f"{m.param_bytes} bytes per weight, a = {i.accumulator_bytes} bytes per accumulated value "
            "(docs/scaling.md)"
        )
        lines.append(
            f"model: {m.total_params / 1e9:.3g}B parameters, {m.trainable_params / 1e6:.4g}M trainable"
            f"{' (LoRA)' if m.lora else ''}, {m.param_bytes} bytes each; optimizer {i.optimizer}; "
            f"world size {i.world_size}, sharding {i.sharding}, offload {i.offload}, mode {i.mode}"
        )
        lines.append(
            f"bounds: {i.open_groups} open groups ("
            + (
                "max_open_groups unbounded: every group of the step on this rank"
                if i.max_open_groups is None
                else f"max_open_groups={i.max_open_groups}"
            )
            + f"), {i.held_trajectories} held trajectories ("
            + (
                "max_held_trajectories unbounded: every trajectory of the open groups"
                if i.max_held_trajectories is None
                else f"max_held_trajectories={i.max_held_trajectories}"
            )
            + ")"
        )
        if i.engine_device_fraction or i.engine_device_bytes:
            share = f"{i.engine_device_fraction:.0%} of the device" if i.engine_device_fraction else ""
            extra = format_bytes(i.engine_device_bytes) if i.engine_device_bytes else ""
            lines.append(f"a colocated rollout engine reserves {' + '.join(x for x in (share, extra) if x)}")
        return "\n".join(lines)


def plan_memory(inputs: PlanInputs) -> MemoryPlan:
    """One rank's rows (module docstring)."""
    i, m = inputs, inputs.model
    n, e, a = i.world_size, m.param_bytes, i.accumulator_bytes
    p, pt = m.total_params, m.trainable_params
    shard = n if i.sharding != "none" else 1
    fsdp = i.sharding == "fsdp2"
    streaming = i.mode != "sync"

    def at(name: str, nbytes: int, note: str, where: str = "device") -> PlanRow:
        return PlanRow(name, **{where: int(nbytes)}, note=note)

    # On a CPU run the device is the host: "device" rows are host memory there (as in ByteUsage).
    offload_where = {"none": "device", "cpu": "pageable_host", "pinned": "pinned_host"}[i.offload]
    rows = [
        at(
            "weights",
            p * e / n + p * e if fsdp else p * e,
            f"P e, sharded over {n} + gathered once per step" if fsdp else "P e",
        ),
    ]
    if i.reference:
        rows.append(at("reference copy", p * e, "P e: a frozen copy for kl_coef (LoRA needs none)"))
    if i.teacher_params:
        where = "device" if i.teacher_on_device else "pageable_host"
        rows.append(
            at("OPD teacher", i.teacher_params * e, "the engine's teacher, at the policy's dtype", where)
        )
    states = OPTIMIZER_STATES[i.optimizer]
    rows += [
        at("gradients", pt * e / (n if fsdp else 1), "P_t e" + (f" / {n}" if fsdp else "")),
        at(
            "optimizer state",
            states * pt * e / shard,
            f"{states} x P_t e ({i.optimizer})" + (f" / {n} ({i.sharding})" if shard > 1 else ""),
        ),
    ]
    dense, held_n = i.sum_buffers, i.held_trajectories
    sums = (dense + i.group_extra_buffers * i.open_groups) * pt * a if streaming else 0
    per_held = 2 if i.held_regulariser else 1
    held = per_held * held_n * pt * a if streaming else 0
    sync_note = "sync mode: every reward is known when scored"
    reached = "worst case: reached when rewards land after content and partial groups are scored"
    rows += [
        at(
            "group sums",
            sums,
            f"({dense} sums + {i.group_extra_buffers} x {i.open_groups} open groups) x P_t a ({reached})"
            if streaming
            else sync_note,
            offload_where,
        ),
        at(
            "held gradients",
            held,
            f"{held_n} held x {per_held} x P_t a (worst case: reached when verdicts lag the learner's calls)"
            if streaming
            else sync_note,
            offload_where,
        ),
        at(
            "step gradient",
            (2 if i.regulariser_buffer else 1) * pt * a,
            "2 x P_t a (scale=batch keeps R apart)" if i.regulariser_buffer else "P_t a",
        ),
    ]
    if i.offload != "none" and i.accelerator == "gpu" and streaming:
        rows.append(at("staging", 2 * pt * a, "2 x P_t a: double-buffered copies to and from the host"))
    if i.offload == "pinned" and streaming:
        rows.append(at("landing", 2 * pt * a, "2 x P_t a: pinned buffers the copies land in", "pinned_host"))
    call = min(i.max_batch_trajectories, i.groups_on_rank * i.group_size)  # trajectories of one call
    d = min(call + 1, i.call_destinations) if streaming and i.call_destinations else 1
    rows.append(
        at(
            "backward",
            d * pt * e,
            "P_t e: one autograd result before it is added"
            if d == 1
            else f"{d} x P_t e: the destinations of one split-backward call",
        )
    )
    if n > 1:
        rows.append(
            at(
                "collective",
                pt * e,
                "P_t e: the flat reduce-scatter input at the barrier"
                if fsdp
                else "P_t e: the flat all-reduce at the barrier",
            )
        )
    if i.weight_sync_buckets:
        largest = max(arch.vocab, arch.intermediate) * arch.hidden * e if (arch := m.architecture) else 0
        bucket = max(i.weight_sync_bucket_bytes, largest)
        rows.append(
            at(
                "weight sync",
                i.weight_sync_buckets * bucket,
                f"{i.weight_sync_buckets} x max(bucket, largest tensor): a bucketed vLLM publish",
            )
        )
    rows += _activation_rows(i)
    if i.device_overhead_bytes:
        rows.append(at("runtime", i.device_overhead_bytes, "CUDA context and allocator slack (fixed)"))
    return MemoryPlan(i, tuple(rows))


def _activation_rows(i: PlanInputs) -> list[PlanRow]:
    arch, e = i.model.architecture, i.model.param_bytes
    if arch is None:
        return [PlanRow("activations", note="unknown: the model has no Hugging Face style config")]
    trajectories = min(i.max_batch_trajectories, i.groups_on_rank * i.group_size)
    tokens, how = call_padded_tokens(
        trajectories,
        i.max_tokens_per_trajectory,
        i.max_batch_tokens,
        i.score_max_padding,
        i.score_forward_tokens,
    )
    per_token = arch.token_activation_bytes(e, i.entropy, i.model.frozen_down_proj)
    rows = [
        PlanRow(
            "activations",
            device=tokens * per_token,
            note=f"{how} x {format_bytes(per_token)} per token"
            + ("" if i.tokens_bounded else " (T unbounded: the model's context window)"),
        )
    ]
    if i.boundary_cut and i.mode != "sync":
        prompt = min(i.max_prompt_tokens or i.max_tokens_per_trajectory, i.max_tokens_per_trajectory)
        leaves = prompt * arch.prefix_bytes_per_token(e) + arch.vocab * e
        per_group = prompt * per_token + (3 + i.group_size) * leaves
        rows.append(
            PlanRow(
                "prompt graphs",
                device=i.open_groups * per_group,
                note=f"{i.open_groups} open groups x ({prompt}-token prompt graph + leaf sums)",
            )
        )
    return rows


def auto_batch_trajectories(inputs: PlanInputs, device_bytes: int, host_bytes: int) -> int:
    """``max_batch_trajectories="auto"``: the most trajectories of one learner call for this machine.

    The largest ``n <= R`` (R: the rank's trajectories of a step, ``groups_on_rank * group_size``)
    whose plan fits ``device_bytes`` / ``host_bytes`` (``inputs.max_batch_trajectories`` is
    ignored), so a step whose trajectories are all waiting is ONE call when its activations fit:
    fewer, larger calls halve the per-call costs (kernel launches, the accumulator's bookkeeping, a
    backward's fixed part) on any device. The plan grows with ``n`` (activations, and the split
    backward's destinations), so the search is a bisection. At least 1 (then the set-up check names
    what would fit); at least ``min(FIXED_BATCH_TRAJECTORIES, R)`` where the plan is a worst case
    (``tokens_bounded`` False: real trajectories are usually far shorter than the context window)
    or sizes no activations (unknown architecture), as before "auto"."""
    most = max(1, inputs.groups_on_rank * inputs.group_size)
    floor = min(FIXED_BATCH_TRAJECTORIES, most)
    if inputs.model.architecture is None:
        return floor

    def fits(n: int) -> bool:
        return plan_memory(replace(inputs, max_batch_trajectories=n)).fits_bytes(device_bytes, host_bytes)

    if fits(most):
        best = most
    else:
        low, high = 0, most - 1  # low: fits (0 stands for "none"), high: the largest still possible
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if fits(mid) else (low, mid - 1)
        best = low
    return max(best, 1 if inputs.tokens_bounded else floor)
