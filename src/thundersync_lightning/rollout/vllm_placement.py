"""Where a vLLM engine's worker process runs when the config does not say: the learner rank's GPU."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch

__all__ = ["colocated_device_ids", "learner_cuda_device", "vllm_accepts_device_ids"]


def colocated_device_ids(config: Any, learner_device: int | None, accepts: bool) -> list[int] | None:
    """GPUs for vLLM's worker process when the config names none: the learner rank's own GPU.

    vLLM's workers otherwise take the first visible GPU, so with one learner rank per GPU (Lightning
    ``devices=K``) every rank's engine would land on GPU 0. ``learner_device`` is the learner's
    ``torch.cuda.current_device()`` (None without CUDA), an index into ``CUDA_VISIBLE_DEVICES``,
    which is how vLLM reads ``device_ids`` too. Only for worker processes (``multiprocessing``),
    one GPU per engine (``tensor_parallel_size=1``) and a vLLM that ``accepts`` ``device_ids``; an
    explicit ``engine_kwargs.device_ids`` (e.g. an engine pool's ``per_engine``) always wins.
    """
    if learner_device is None or not accepts or not config.multiprocessing or config.tensor_parallel_size != 1:
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
