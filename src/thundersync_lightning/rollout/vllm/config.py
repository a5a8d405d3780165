"""How to run vLLM: :class:`VLLMEngineConfig`, LightningCLI/YAML-constructible and validated on
construction (every problem at once); ``build`` starts the :class:`~.engine.VLLMEngine`.

YAML class path: ``thundersync_lightning.rollout.VLLMEngineConfig``. Importing it does not import vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from ...core.errors import ConfigError
from ...core.options import inapplicable, strict_options
from ...core.protocols import STEP_TIMEOUT_S, VERDICT_TIMEOUT_S, EngineFootprint, EngineSampling, TaskSource
from ...core.types import ModelSpec
from ..agent.limits import EventLimits, check_event_timeout
from ..teacher import TeacherConfig

if TYPE_CHECKING:
    from .engine import VLLMEngine

__all__ = ["VLLMEngineConfig", "WeightSync"]

WeightSync = Literal["auto", "direct", "file", "ipc", "nccl"]


@strict_options
@dataclass(frozen=True, slots=True)
class VLLMEngineConfig(EventLimits):
    """How to run vLLM (LightningCLI/YAML-constructible; ``build`` makes the engine).

    Args:
        temperature: sampling temperature T (> 0); the learner must score with the same T.
        kv_cache_memory_bytes: KV-cache size. Required on CPU (vLLM cannot size it there);
            ``None`` on GPU to size it from ``gpu_memory_utilization`` instead.
        gpu_memory_utilization: fraction of GPU memory vLLM may take (GPU, when the KV size is None).
        max_model_len: longest episode context in tokens (None: the model's maximum).
        max_num_seqs: most sequences vLLM batches at once.
        enable_prefix_caching: reuse KV blocks of shared prefixes (the group's prompt, earlier turns).
        enforce_eager: no CUDA graphs / compilation (required on CPU; faster start everywhere).
        multiprocessing: run vLLM's engine core in its own process (GPU) or in this one (CPU: starts
            in ~12 s instead of ~33 s and allows ``weight_sync="direct"``).
        weight_sync: how a publish reaches vLLM (:mod:`..weights.transport`). "direct" hands the
            tensors to the in-process worker (needs ``multiprocessing=False``); "file" writes a
            safetensors file to ``weights_dir`` that every worker reads (worker processes, tensor
            parallelism, CPU or GPU); "ipc" shares bucketed buffers with the workers (CUDA IPC on
            the learner's GPU; a ``/dev/shm`` file on CPU); "nccl" broadcasts buckets from the
            learner into the workers through a process group of their own (NCCL on GPUs, gloo on
            CPU). "auto": "direct" in-process; with worker processes "file" without CUDA, "ipc"
            when the engine's one GPU is the learner's, "nccl" otherwise
            (:func:`~.placement.resolve_weight_sync`).
        weights_dir: where "file" sync writes (``/dev/shm``: memory, not disk).
        weight_sync_bucket_bytes: "ipc"/"nccl": bytes per bucket; a publish holds one bucket extra
            on each side (a larger tensor: itself), never a second copy of the weights.
        tensor_parallel_size: vLLM tensor parallelism (GPU).
        dtype: generation dtype (None: the ModelSpec's dtype; keep them equal for exact logprobs).
        seed: vLLM's global seed (per-request seeds decide the samples).
        env_workers: threads for environment calls (reset/step/verdict/close).
        step_timeout_s: limit for one environment reset or step; verdict_timeout_s: for one verdict.
        event_timeout_s: the rollout iterator raises :class:`EngineError` after this long without
            an event (a hung environment or engine); ``publish`` raises after waiting this long for
            earlier requests to finish generating. ``"auto"`` (default): derived from the limits that
            bound every event, ``600 + 2 * (max_turns * step_timeout_s + verdict_timeout_s)``
            (:mod:`..agent.limits`; unbounded when either is None); bucket transfers then wait 600 s.
        max_engine_restarts: with ``multiprocessing=True``, how many times an engine core that dies
            (killed, OOM) is restarted, with the latest published weights loaded again and the
            unfinished generation calls rerun with their seeds (exact: the same tokens), before the
            engine fails with :class:`EngineError`. Costs a CPU copy of the latest publish
            (0: fail at the first death and keep no copy). No effect in-process.
        engine_kwargs: further keyword arguments for ``vllm.LLM`` (they override the above).
        teacher: on-policy distillation: a teacher model (the embedded engine's
            :class:`~.teacher.TeacherConfig`) served by a second vLLM engine with the same settings,
            which scores every finished trajectory's sampled tokens at ``temperature`` before its
            ContentReady (``Segment.teacher_logprobs``); see :mod:`.teacher`.
        teacher_engine_kwargs: ``vllm.LLM`` keyword arguments for the teacher's engine only (on
            top of ``engine_kwargs``), e.g. its share of GPU memory.
    """

    temperature: float = 1.0
    kv_cache_memory_bytes: int | None = 512 * 1024 * 1024
    gpu_memory_utilization: float = 0.5
    max_model_len: int | None = None
    max_num_seqs: int = 256
    enable_prefix_caching: bool = True
    enforce_eager: bool = True
    multiprocessing: bool = False
    weight_sync: WeightSync = "auto"
    weights_dir: str = "/dev/shm"
    weight_sync_bucket_bytes: int = 256 * 1024 * 1024
    tensor_parallel_size: int = 1
    dtype: str | None = None
    seed: int = 0
    env_workers: int = 16
    step_timeout_s: float | None = STEP_TIMEOUT_S
    verdict_timeout_s: float | None = VERDICT_TIMEOUT_S
    event_timeout_s: float | Literal["auto"] = "auto"
    max_engine_restarts: int = 1
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    teacher: TeacherConfig | None = None
    teacher_engine_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.teacher is not None and not isinstance(self.teacher, TeacherConfig):
            problems.append(f"teacher must be a TeacherConfig or None, got {type(self.teacher).__name__}")
        if self.teacher is None:
            problems += inapplicable(self, ("teacher_engine_kwargs",), "without a teacher")
        if not self.temperature > 0:
            problems.append(
                f"temperature must be > 0 (got {self.temperature}); greedy "
                "decoding has no logprobs to train on"
            )
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            problems.append("kv_cache_memory_bytes must be positive (or null on GPU)")
        if (
            not isinstance(self.gpu_memory_utilization, (int, float))
            or not 0 < self.gpu_memory_utilization <= 1
        ):
            problems.append(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_model_len is not None and self.max_model_len < 2:
            problems.append(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.weight_sync not in get_args(WeightSync):
            problems.append(f"weight_sync must be one of {get_args(WeightSync)}, got {self.weight_sync!r}")
        if self.weight_sync_bucket_bytes < 1:
            problems.append(f"weight_sync_bucket_bytes must be >= 1, got {self.weight_sync_bucket_bytes}")
        if self.weight_sync == "direct" and self.multiprocessing:
            problems.append(
                "weight_sync='direct' needs multiprocessing=False; use "
                "weight_sync='file' with worker processes"
            )
        for name in ("max_num_seqs", "tensor_parallel_size", "env_workers"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_engine_restarts < 0:
            problems.append(f"max_engine_restarts must be >= 0, got {self.max_engine_restarts}")
        problems += check_event_timeout(self.event_timeout_s)
        if not self.multiprocessing:
            problems += inapplicable(
                self, ("max_engine_restarts",), "with multiprocessing=False (the engine core is this process)"
            )
        if self.kv_cache_memory_bytes is not None:
            problems += inapplicable(
                self,
                ("gpu_memory_utilization",),
                "while kv_cache_memory_bytes is set (leave it at its default 0.5)",
            )
        in_process_auto = self.weight_sync == "auto" and not self.multiprocessing
        sync = f"weight_sync={self.weight_sync!r}" + (
            " and multiprocessing=False (it resolves to 'direct')" if in_process_auto else ""
        )
        if self.weight_sync in ("direct", "ipc", "nccl") or in_process_auto:
            problems += inapplicable(self, ("weights_dir",), f"with {sync} (no file is written)")
        if self.weight_sync in ("direct", "file") or in_process_auto:
            problems += inapplicable(self, ("weight_sync_bucket_bytes",), f"with {sync} (no buckets)")
        if problems:
            raise ConfigError("invalid VLLMEngineConfig: " + "; ".join(problems))

    @property
    def sampling(self) -> EngineSampling:
        """softmax(z / T), untruncated; logprobs reported; a teacher when one is set."""
        return EngineSampling(self.temperature, logprobs=True, teacher=self.teacher is not None)

    @property
    def footprint(self) -> EngineFootprint:
        """Colocated on the learner's GPU: ``gpu_memory_utilization`` of it, or (a fixed KV cache)
        ``kv_cache_memory_bytes`` plus a copy of the weights; episodes bounded by ``max_model_len``.

        Buckets of a bucketed publish on the learner's GPU: 2 for "ipc" (the learner's and the
        engine's copy), 1 for "nccl", none otherwise; "auto" with worker processes is "ipc" here (the
        plan places vLLM on the learner's GPU, where :func:`~.placement.resolve_weight_sync` picks
        "ipc"), "nccl" with tensor parallelism.
        """
        sync: str = self.weight_sync
        if sync == "auto" and self.multiprocessing:
            sync = "ipc" if self.tensor_parallel_size == 1 else "nccl"
        buckets = {"ipc": 2, "nccl": 1}.get(sync, 0)
        fixed_kv = self.kv_cache_memory_bytes is not None
        return EngineFootprint(
            max_context_tokens=self.max_model_len,
            on_learner_device=True,
            device_fraction=0.0 if fixed_kv else float(self.gpu_memory_utilization),
            device_bytes=int(self.kv_cache_memory_bytes or 0),
            policy_copies=int(fixed_kv),
            weight_sync_buckets=buckets,
            weight_sync_bucket_bytes=self.weight_sync_bucket_bytes if buckets else 0,
            exclusive_in_process=None
            if self.multiprocessing
            else (
                "VLLMEngineConfig(multiprocessing=False) runs inside the learner's process, and vLLM keeps "
                "one in-process engine per process: set multiprocessing: true and weight_sync: file"
            ),
        )

    def build(self, model_spec: ModelSpec, tasks: TaskSource) -> VLLMEngine:
        """Start vLLM with ``model_spec``'s architecture (blocks until it is ready)."""
        from .engine import VLLMEngine  # lazily: vLLM is imported only to start an engine

        return VLLMEngine(self, model_spec, tasks)
