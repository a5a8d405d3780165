"""The memory plan of a fit, from its settings, and the set-up check that refuses one that cannot fit.

:func:`plan_inputs` turns plain settings (the strategy's, the data module's, the engine
configuration's, the objective) into :class:`~thundersync_lightning.planning.memory_plan.PlanInputs`;
``fit`` reads them from the live objects (:func:`fit_plan`), ``thundersync-lightning plan`` from
the parsed YAML, so both plan the same thing. Options other helpers add to the strategy
(``max_held_trajectories``, ``sharding``) are read with their defaults when absent.

Capacity at set-up (:func:`machine_capacity`): on a GPU the device's free bytes; on a CPU run the
device is the host, whose available RAM plus the bytes of the module already resident (its
weights exist before the check) is the budget. What the engine takes of the learner's GPU is its
declared :class:`~thundersync_lightning.core.protocols.EngineFootprint` (a colocated vLLM engine's
share of the device, or its KV-cache bytes plus a weight copy).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import psutil
import torch

from ..backends.split import planned_destinations
from ..core.grpo.objective import Objective
from ..core.protocols import EngineFootprint
from ..planning.memory_plan import (
    FIXED_BATCH_TRAJECTORIES,
    MemoryPlan,
    PlanInputs,
    auto_batch_trajectories,
    format_bytes,
    plan_memory,
)
from ..planning.model_shape import Architecture, ModelShape
from .objective_checks import module_objective

__all__ = [
    "STRATEGY_KEYS",
    "SCORING_KEYS",
    "plan_inputs",
    "fit_plan",
    "fit_capacity",
    "resolve_call_rows",
    "machine_capacity",
    "memory_problems",
    "param_bytes",
    "optimizer_kind",
]

log = logging.getLogger(__name__)

#: Bytes of the CUDA context, kernels and allocator slack, planned on every GPU.
GPU_RUNTIME_BYTES = 2**30
#: T when neither the engine nor the model states a context limit.
DEFAULT_MAX_TOKENS = 4096
_HALF = {"bf16-true", "16-true", "bf16", "16", "half"}
_DOUBLE = {"64-true", "64", "double"}
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8, "double": 8}
STRATEGY_KEYS = (
    "mode",
    "offload",
    "max_open_groups",
    "max_held_trajectories",
    "max_batch_trajectories",
    "max_batch_tokens",
    "boundary_cut",
    "sharding",
    "split_backward",
)
#: The module's options that bound a call's padding (GRPOPolicy's; a module without them: unknown).
SCORING_KEYS = ("score_max_padding", "score_forward_tokens")


def param_bytes(precision: Any, dtype: str | torch.dtype | None) -> int:
    """e: the weights' element size after Lightning's precision plugin converts the module."""
    p = str(precision) if precision is not None else ""
    if p in _HALF:
        return 2
    if p in _DOUBLE:
        return 8
    if isinstance(dtype, torch.dtype):
        return torch.empty((), dtype=dtype).element_size()
    return _DTYPE_BYTES.get(str(dtype or "float32").removeprefix("torch."), 4)


def optimizer_kind(optimizer: Any) -> str:
    """The plan's optimizer name for a torch optimizer (unknown ones are planned as AdamW: 2 states)."""
    name = type(optimizer).__name__.lower()
    if name == "sgd":
        return "sgd_momentum" if any(g.get("momentum", 0) for g in optimizer.param_groups) else "sgd"
    return "adam" if name == "adam" else "adamw"


def _module_optimizer(module: Any) -> str:
    """``configure_optimizers``'s first optimizer (built over the parameters; no state yet)."""
    try:
        out = module.configure_optimizers()
    except Exception:  # noqa: BLE001 - a hook that needs the trainer's later state: plan AdamW
        return "adamw"
    while isinstance(out, (list, tuple)) and out:
        out = out[0]
    if isinstance(out, Mapping):
        out = out.get("optimizer")
    return optimizer_kind(out) if isinstance(out, torch.optim.Optimizer) else "adamw"


def plan_inputs(
    *,
    model: ModelShape,
    objective: Objective,
    accelerator: str,
    world_size: int,
    strategy: Mapping[str, Any],
    data: Mapping[str, Any],
    engine: EngineFootprint,
    engine_teacher: bool = False,
    optimizer: str = "adamw",
    reference: bool | None = None,
    scoring: Mapping[str, Any] | None = None,
) -> PlanInputs:
    """PlanInputs from plain settings (``strategy``/``data``: option name -> value) and the engine
    config's declared ``footprint`` (``engine_teacher``: its ``sampling.teacher``).

    ``reference``: whether a frozen copy exists (None: kl_coef != 0 without LoRA). ``scoring``:
    the module's ``score_max_padding`` / ``score_forward_tokens`` (absent: padding unknown).
    """
    scoring = scoring or {}
    gpu = accelerator == "gpu"
    arch = model.architecture
    limits = [engine.max_context_tokens, data.get("max_episode_tokens")]
    known = [int(v) for v in limits if isinstance(v, int) and v > 0]
    bounded = bool(known)  # else only the model's context window bounds an episode
    if arch is not None and arch.max_positions:
        known.append(int(arch.max_positions))
    on_device = gpu and engine.on_learner_device
    weights = model.total_params * model.param_bytes
    engine_bytes = engine.device_bytes + engine.policy_copies * weights if on_device else 0
    buckets = engine.weight_sync_buckets if gpu else 0
    teacher = objective.needs_teacher and engine_teacher
    return PlanInputs(
        model=model,
        optimizer=optimizer,  # type: ignore[arg-type]
        accelerator="gpu" if gpu else "cpu",
        world_size=world_size,
        sharding=strategy.get("sharding", "none"),
        offload=strategy.get("offload", "none"),
        mode=strategy.get("mode", "streaming"),
        max_open_groups=strategy.get("max_open_groups"),
        max_held_trajectories=strategy.get("max_held_trajectories"),
        groups_per_step=int(
            data.get("groups_per_step", 16)
        )  # with dynamic sampling's reserve: the most a step opens
        + (
            int(data.get("max_extra_groups") or data.get("groups_per_step", 16))
            if data.get("dynamic_sampling")
            else 0
        ),
        group_size=int(data.get("group_size", 8)),
        max_tokens_per_trajectory=min(known) if known else DEFAULT_MAX_TOKENS,
        tokens_bounded=bounded,
        # "auto" is planned at its floor until a machine is known: fit_plan (and the plan command,
        # given the machine) resolve it (auto_batch_trajectories)
        max_batch_trajectories=_rows_setting(strategy, data, world_size),
        max_batch_tokens=strategy.get("max_batch_tokens"),
        score_max_padding=None
        if scoring.get("score_max_padding") is None
        else float(scoring["score_max_padding"]),
        score_forward_tokens=int(scoring.get("score_forward_tokens") or 0),
        boundary_cut=bool(strategy.get("boundary_cut", False)),
        reference=(objective.needs_reference and not model.lora) if reference is None else reference,
        entropy=objective.needs_entropy,
        regulariser_buffer=objective.scales_at_barrier and objective.has_regulariser_terms,
        held_regulariser=objective.failed == "drop" and objective.has_regulariser_terms,
        group_extra_buffers=int(bool(data.get("dynamic_sampling")) and objective.has_regulariser_terms)
        + (int(data.get("group_size", 8)) if objective.off_policy_mask is not None else 0),
        teacher_params=model.total_params if teacher else 0,  # planned at the policy's size
        teacher_on_device=on_device,
        engine_device_fraction=engine.device_fraction if on_device else 0.0,
        engine_device_bytes=engine_bytes,
        accumulator_bytes=8 if model.param_bytes == 8 else 4,
        device_overhead_bytes=GPU_RUNTIME_BYTES if gpu else 0,
        weight_sync_buckets=buckets,
        weight_sync_bucket_bytes=engine.weight_sync_bucket_bytes if buckets else 0,
        call_destinations=planned_destinations(
            strategy.get("split_backward", "auto"),
            strategy.get("mode", "streaming"),
            bool(strategy.get("boundary_cut", False)),
            strategy.get("sharding", "none"),
            model.trainable_params,
            model.param_bytes,
        ),
    )


def _rows_setting(strategy: Mapping[str, Any], data: Mapping[str, Any], world_size: int) -> int:
    rows = strategy.get("max_batch_trajectories", "auto")
    if rows != "auto":
        return int(rows)
    groups = int(data.get("groups_per_step", 16))
    if data.get("dynamic_sampling"):
        groups += int(data.get("max_extra_groups") or groups)
    return min(FIXED_BATCH_TRAJECTORIES, -(-groups // max(1, world_size)) * int(data.get("group_size", 8)))


def _settings(obj: Any, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    if obj is None:
        return {}
    if names is None:
        fields = getattr(obj, "__dataclass_fields__", None)
        names = tuple(fields) if fields else tuple(k for k in vars(obj) if not k.startswith("_"))
    return {n: getattr(obj, n) for n in names if hasattr(obj, n)}


def fit_plan(trainer: Any, strategy: Any) -> MemoryPlan:
    """The plan of the fit about to start, read from the live module, data module and strategy;
    ``max_batch_trajectories="auto"`` resolved for this machine (:func:`auto_batch_trajectories`)."""
    plan = _fit_plan(trainer, strategy)
    if getattr(strategy, "max_batch_trajectories", None) != "auto":
        return plan
    device, host = fit_capacity(trainer, strategy)
    rows = auto_batch_trajectories(plan.inputs, device, host)
    return plan_memory(replace(plan.inputs, max_batch_trajectories=rows))


def resolve_call_rows(trainer: Any, strategy: Any) -> int | None:
    """``max_batch_trajectories="auto"`` resolved for the fit about to start (None: a number was set)."""
    if strategy.max_batch_trajectories != "auto":
        return None
    rows = fit_plan(trainer, strategy).inputs.max_batch_trajectories
    log.info("max_batch_trajectories='auto': %d trajectories per learner call", rows)
    return rows


def fit_capacity(trainer: Any, strategy: Any) -> tuple[int, int]:
    """(device bytes, host bytes) the fit's plan is checked against: :func:`machine_capacity`, and on
    a CPU run the module's resident bytes added back (the plan counts them; 'available' does not)."""
    device, host = machine_capacity(strategy.root_device)
    if strategy.root_device.type != "cuda":
        device = host = host + _resident_bytes(trainer.lightning_module)
    return device, host


def _fit_plan(trainer: Any, strategy: Any) -> MemoryPlan:
    module = trainer.lightning_module
    params = list(module.parameters())
    trainable = [p for p in params if p.requires_grad]
    arch = Architecture.of(getattr(getattr(module, "model", None), "config", None))
    hparams = getattr(module, "hparams", {}) or {}
    first = (trainable or params)[0]
    shape = ModelShape(
        total_params=sum(p.numel() for p in params),
        trainable_params=sum(p.numel() for p in trainable),
        param_bytes=param_bytes(getattr(trainer, "precision", None), first.dtype),
        architecture=arch,
        lora=hparams.get("lora") is not None,
        lora_params_per_rank=arch.lora_params_per_rank if arch is not None else 0,
    )
    data = getattr(trainer, "datamodule", None)
    engine = getattr(data, "engine_factory", None)  # its contract was checked at set-up (check_engine)
    return plan_memory(
        plan_inputs(
            model=shape,
            objective=module_objective(module),
            accelerator="gpu" if strategy.root_device.type == "cuda" else "cpu",
            world_size=strategy.num_nodes * strategy.num_processes,
            strategy={"sharding": "none", **_settings(strategy, STRATEGY_KEYS)},
            data={
                **_settings(data, ("groups_per_step", "group_size", "dynamic_sampling", "max_extra_groups")),
                "max_episode_tokens": _episode_bound(data),
            },
            engine=engine.footprint if engine is not None else EngineFootprint(),
            engine_teacher=engine is not None and engine.sampling.teacher,
            optimizer=_module_optimizer(module),
            reference=getattr(module, "reference", None) is not None,
            scoring={k: hparams[k] for k in SCORING_KEYS if k in hparams},
        )
    )


def _episode_bound(data: Any) -> int | None:
    """The task source's own bound on an episode's tokens (``max_episode_tokens()``), if it has one."""
    bound = getattr(getattr(data, "tasks", None), "max_episode_tokens", None)
    try:
        return int(bound()) if callable(bound) else None
    except Exception:  # noqa: BLE001 - an optional hint; planning goes on without it
        return None


def machine_capacity(device: torch.device) -> tuple[int, int]:
    """(device bytes, host bytes) free now; on a CPU the device is the host."""
    host = int(psutil.virtual_memory().available)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), host
    return host, host


def _resident_bytes(module: Any) -> int:
    """Bytes of the module's tensors already in host memory (counted by the plan, absent from 'available')."""
    tensors = [*module.parameters(), *module.buffers()]
    reference = getattr(module, "reference", None)
    if isinstance(reference, torch.nn.Module):
        tensors += [*reference.parameters(), *reference.buffers()]
    unique = {id(t): t for t in tensors if t.device.type == "cpu"}
    return sum(t.numel() * t.element_size() for t in unique.values())


def memory_problems(trainer: Any, strategy: Any) -> tuple[list[str], bool]:
    """(one problem naming the settings that would make the fit's plan fit, or none; whether the
    plan is certain enough to refuse the fit). A plan whose trajectory length is bounded only by
    the model's context window is a worst case: it is reported, never refused."""
    plan = fit_plan(trainer, strategy)
    device, host = fit_capacity(trainer, strategy)
    verdict = plan.fits(device, host)
    if verdict.fits:
        log.info(
            "memory plan fits: %s on the %s",
            format_bytes(plan.device_bytes + plan.host_bytes),
            plan.inputs.accelerator,
        )
        return [], False
    where = "GPU" if plan.inputs.accelerator == "gpu" else "host (a CPU run: the device is the host)"
    certain = plan.inputs.tokens_bounded
    unbounded = (
        ""
        if certain
        else "Nothing bounds an episode's length but the model's context "
        f"({plan.inputs.max_tokens_per_trajectory} tokens), so this is a worst case: set the engine's "
        "max_context_tokens (vLLM: max_model_len) to plan and bound it.\n"
    )
    return [
        f"the learner's memory plan does not fit this {where}; it would run out of memory mid-step.\n"
        f"{unbounded}{verdict.message()}\n{plan.table()}\n"
        "(`thundersync-lightning plan --config ...` prints this plan; "
        "trainer.strategy.init_args.memory_check=warn runs anyway)"
    ], certain
