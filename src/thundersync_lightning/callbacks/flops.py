"""Model FLOPs of the learner's work and the peak FLOPs of the device: the two halves of MFU.

Analytic count (the default), for a decoder-only transformer trained on trajectories of lengths
``n_i`` (PaLM, Chowdhery et al. 2022, Appendix B; the same formula as nanoGPT's
``estimate_mfu``)::

    F_step = (4 N_fwd + 2 N_train) * T  +  12 L H Q * sum_i n_i^2

Notation:
    N_fwd    parameters that take part in a matmul in the forward pass: every parameter except
             the input embedding table (a lookup), counting a tied output head once.
    N_train  the trainable ones among them (all of them, unless adapters such as LoRA are used).
    T        tokens the learner ran forward and backward on (``StepStats.learner_tokens``).
    L, H, Q  layers, query heads, head dimension.
    n_i      tokens of trajectory i (``TrajectoryRecord.num_tokens``).

Each parameter costs 2 FLOPs per token forward, 2 for the gradient of the activations and 2 for
its own gradient when it trains: 6 N per token when everything trains (Kaplan et al. 2020, 2.1).
The attention term counts the scores ``Q K^T`` and ``A V`` (4 L H Q n per token forward, three
times that with backward) over the full ``n x n`` matrix, like PaLM: causal masking is not
subtracted. Recomputation (activation checkpointing) is not counted: this is *model* FLOPs.

Measured count (``flops="measured"``): Lightning's ``measure_flops`` (torch ``FlopCounterMode``)
on a meta-device copy of the architecture, forward and backward of one sequence per distinct
length, cached; it counts every parameter as trainable.

Peak FLOPs, in order: an explicit value; Lightning's ``get_available_flops`` where it knows the
device; :data:`PEAK_FLOPS_TABLE` for devices it misses (names as ``torch.cuda.get_device_name``
reports them; it holds only names Lightning misses, so it is consulted first and Lightning does not
warn about them); on CPU, a one-off matmul calibration (the best of a few ``size x size`` matmuls:
an achievable rate, not a datasheet number). The source is returned with the value.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from lightning.fabric.utilities.throughput import get_available_flops, measure_flops

__all__ = [
    "TransformerShape",
    "transformer_shape",
    "analytic_step_flops",
    "MeasuredFlops",
    "PeakFlops",
    "PEAK_FLOPS_TABLE",
    "precision_to_dtype",
    "calibrate_matmul_flops",
    "resolve_peak_flops",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TransformerShape:
    """What the analytic count needs to know about the policy (see the module docstring)."""

    matmul_params: int  # N_fwd
    trainable_matmul_params: int  # N_train
    num_layers: int  # L
    num_heads: int  # H
    head_dim: int  # Q


def _numel(params: Iterable[torch.nn.Parameter], only_trainable: bool) -> int:
    return sum(p.numel() for p in params if p.requires_grad or not only_trainable)


def transformer_shape(model: torch.nn.Module) -> TransformerShape:
    """Read N_fwd, N_train, L, H, Q from a Hugging Face causal LM (``model.config``)."""
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(
            f"{type(model).__name__} has no `.config`: the analytic FLOPs count needs a Hugging Face "
            'model; pass MFUMonitor(flops="measured") or an explicit count.'
        )
    params = list(model.parameters())  # a tied weight appears once
    total, trainable = _numel(params, False), _numel(params, True)
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    emb = get_in() if callable(get_in) else None
    head = get_out() if callable(get_out) else None
    if emb is not None and getattr(emb, "weight", None) is not None:
        tied = head is not None and getattr(head, "weight", None) is emb.weight
        if not tied:  # the lookup table does no matmul; a tied table is also the head's matmul
            total -= emb.weight.numel()
            trainable -= emb.weight.numel() if emb.weight.requires_grad else 0
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    return TransformerShape(total, trainable, layers, heads, int(head_dim))


def analytic_step_flops(shape: TransformerShape, learner_tokens: int, lengths: Iterable[int]) -> int:
    """``(4 N_fwd + 2 N_train) T + 12 L H Q sum_i n_i^2`` (module docstring), an exact integer."""
    dense_per_token = 4 * shape.matmul_params + 2 * shape.trainable_matmul_params
    dense = dense_per_token * int(learner_tokens)
    attention = 12 * shape.num_layers * shape.num_heads * shape.head_dim * sum(int(n) ** 2 for n in lengths)
    return dense + attention


class MeasuredFlops:
    """Forward+backward FLOPs of one sequence of each length, counted by ``measure_flops`` on a
    meta-device copy of ``model``'s architecture (no memory, no compute), cached per length."""

    def __init__(self, model: torch.nn.Module) -> None:
        from transformers import AutoModelForCausalLM

        config = getattr(model, "config", None)
        if config is None:
            raise ValueError(f"{type(model).__name__} has no `.config` to rebuild on the meta device")
        with torch.device("meta"):
            self._meta = AutoModelForCausalLM.from_config(config)
        self._cache: dict[int, int] = {}

    def sequence_flops(self, length: int) -> int:
        if length not in self._cache:
            ids = torch.zeros(1, length, dtype=torch.long, device="meta")

            def forward() -> torch.Tensor:
                return self._meta(input_ids=ids).logits

            self._cache[length] = int(measure_flops(self._meta, forward, lambda y: y.sum()))
        return self._cache[length]

    def step_flops(self, lengths: Iterable[int]) -> int:
        return sum(self.sequence_flops(int(n)) for n in lengths if n > 0)


# Dense (no sparsity) peak FLOP/s per device, for devices Lightning's table misses, keyed by the
# lower-cased name torch reports. "tfloat32" is used for float32 matmuls when
# torch.get_float32_matmul_precision() != "highest" (Lightning's rule).
# Sources: NVIDIA H200 datasheet (SXM: 1,979 TFLOPS BF16 with sparsity -> 989.5 dense; NVL: 1,671),
# GH200 datasheet, HGX B200 datasheet (per GPU: 4.5 PFLOPS BF16 with sparsity -> 2.25 dense).
_HOPPER_SXM: Mapping[Any, float] = {
    torch.float64: 34e12,
    torch.float32: 67e12,
    "tfloat32": 494.7e12,
    torch.bfloat16: 989.5e12,
    torch.float16: 989.5e12,
    torch.int8: 1979e12,
}
PEAK_FLOPS_TABLE: Mapping[str, Mapping[Any, float]] = {
    "nvidia h200": _HOPPER_SXM,
    "nvidia h100": _HOPPER_SXM,
    "nvidia gh200 480gb": _HOPPER_SXM,
    "nvidia gh200 144g hbm3e": _HOPPER_SXM,
    "nvidia h200 nvl": {
        torch.float64: 30e12,
        torch.float32: 60e12,
        "tfloat32": 417.5e12,
        torch.bfloat16: 835.5e12,
        torch.float16: 835.5e12,
        torch.int8: 1671e12,
    },
    "nvidia b200": {
        torch.float64: 37e12,
        torch.float32: 75e12,
        "tfloat32": 1.1e15,
        torch.bfloat16: 2.25e15,
        torch.float16: 2.25e15,
        torch.int8: 4.5e15,
    },
}


@dataclass(frozen=True, slots=True)
class PeakFlops:
    """Peak FLOP/s of one device and where the number came from."""

    flops_per_second: float | None
    source: str  # "explicit" | "lightning" | "table" | "calibrated" | "unknown"
    device_name: str


def precision_to_dtype(precision: str) -> torch.dtype:
    """The matmul dtype of a Lightning precision string ("bf16-mixed", "16-true", "32-true", ...)."""
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    if precision.startswith("64"):
        return torch.float64
    return torch.float32


def calibrate_matmul_flops(
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    size: int = 1024,
    repeats: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """FLOP/s of the best of ``repeats`` ``size x size`` matmuls (``2 size^3`` FLOPs each) after one
    warm-up: the rate this device actually reaches on a thick matmul, used as its peak."""
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    _sync(device)
    a @ b
    best = math.inf
    for _ in range(repeats):
        start = clock()
        a @ b
        _sync(device)
        best = min(best, clock() - start)
    if best <= 0:
        raise RuntimeError(f"matmul calibration measured {best} s: the clock did not advance")
    return 2 * size**3 / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def _table_flops(name: str, dtype: torch.dtype) -> float | None:
    row = PEAK_FLOPS_TABLE.get(name.lower())
    if row is None:
        return None
    key: Any = dtype
    if dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest":
        key = "tfloat32"
    return row.get(key)


def resolve_peak_flops(
    device: torch.device,
    dtype: torch.dtype,
    explicit: float | None = None,
    calibrate: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> PeakFlops:
    """Peak FLOP/s of one ``device`` for matmuls in ``dtype``, with its source (module docstring)."""
    name = _device_name(device)
    if explicit is not None:
        if explicit <= 0:
            raise ValueError(f"peak_flops must be > 0, got {explicit}")
        return PeakFlops(float(explicit), "explicit", name)
    if device.type != "cpu":
        tabled = _table_flops(name, dtype)  # only names Lightning misses: asked first, no warning
        if tabled:
            return PeakFlops(tabled, "table", name)
        known = get_available_flops(device, dtype)
        if known:
            return PeakFlops(float(known), "lightning", name)
    elif calibrate:
        return PeakFlops(calibrate_matmul_flops(device, dtype, clock=clock), "calibrated", name)
    log.warning(
        "No peak FLOPs known for %r in %s: MFU is not logged. Pass MFUMonitor(peak_flops=...) with "
        "the device's dense peak FLOP/s.",
        name,
        dtype,
    )
    return PeakFlops(None, "unknown", name)
