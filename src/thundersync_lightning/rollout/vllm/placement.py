"""Where a vLLM engine's worker process runs when the config does not say (the learner rank's GPU),
and the weight transport that placement calls for (``weight_sync: auto``)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch

__all__ = ["colocated_device_ids", "learner_cuda_device", "resolve_weight_sync", "vllm_accepts_device_ids"]


def colocated_device_ids(config: Any, learner_device: int | None, accepts: bool) -> list[int] | None:
    """GPUs for vLLM's worker process when the config names none: the learner rank's own GPU.

    vLLM's workers otherwise take the first visible GPU, so with one learner rank per GPU (Lightning
    ``devices=K``) every rank's engine would land on GPU 0. ``learner_device`` is the learner's
    ``torch.cuda.current_device()`` (None without CUDA), an index into ``CUDA_VISIBLE_DEVICES``,
    which is how vLLM reads ``device_ids`` too. Only for worker processes (``multiprocessing``),
    one GPU per engine (``tensor_parallel_size=1``) and a vLLM that ``accepts`` ``device_ids``; an
    explicit ``engine_kwargs.device_ids`` (e.g. an engine pool's ``per_engine``) always wins.
    """
    if (
        learner_device is None
        or not accepts
        or not config.multiprocessing
        or config.tensor_parallel_size != 1
    ):
        return None
    if "device_ids" in config.engine_kwargs:
        return None
    return [learner_device]


def learner_cuda_device() -> int | None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    return None


def vllm_accepts_device_ids() -> bool:
    from vllm.engine.arg_utils import EngineArgs

    return "device_ids" in {f.name for f in fields(EngineArgs)}


def resolve_weight_sync(
    config: Any, learner_device: int | None, engine_devices: list[int], cuda: bool
) -> str:
    """``config.weight_sync``, with ``"auto"`` resolved from where the engine runs.

    In the learner's process (``multiprocessing=False``): "direct". Worker processes without CUDA
    (``cuda`` False): "file". On CUDA: "ipc" when the engine has one GPU and it is the learner's
    (``learner_device``, its ``torch.cuda.current_device()``; 0 before CUDA is initialised), so
    the workers map the learner's buckets in place; "nccl" when the engine runs on another GPU or
    on several (tensor parallelism). ``engine_devices``: the GPUs vLLM's workers take
    (``device_ids``; vLLM's default is the first visible GPU, ``[0]``).
    """
    if config.weight_sync != "auto":
        return str(config.weight_sync)
    if not config.multiprocessing:
        return "direct"
    if not cuda:
        return "file"
    if config.tensor_parallel_size == 1 and list(engine_devices[:1]) == [learner_device or 0]:
        return "ipc"
    return "nccl"
