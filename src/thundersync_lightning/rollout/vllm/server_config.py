"""How to reach vLLM servers on other machines: :class:`VLLMServerEngineConfig`, LightningCLI/YAML-
constructible and validated on construction (every problem at once); ``build`` connects the
:class:`~.server_engine.VLLMServerEngine`.

YAML class path: ``thundersync_lightning.rollout.VLLMServerEngineConfig``. Neither this module nor
the engine imports vLLM: the learner's machine needs no vLLM install.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ...core.errors import ConfigError
from ...core.options import strict_options
from ...core.protocols import STEP_TIMEOUT_S, VERDICT_TIMEOUT_S, EngineFootprint, EngineSampling, TaskSource
from ...core.types import ModelSpec
from ..agent.limits import EventLimits, check_event_timeout
from .server_client import check_url

if TYPE_CHECKING:
    from .server_engine import VLLMServerEngine

__all__ = ["VLLMServerEngineConfig"]


@strict_options
@dataclass(frozen=True, slots=True)
class VLLMServerEngineConfig(EventLimits):
    """vLLM servers to generate on (LightningCLI/YAML-constructible; ``build`` connects the engine).

    Each server is vLLM's own ``vllm serve`` with this package's worker extension (docs/vllm.md,
    "Servers on other machines", has the command). Every server holds the full model (a replica);
    requests spread over them.

    Args:
        urls: the servers, ``http://HOST:PORT`` each (at least one, no repeats).
        temperature: sampling temperature T (> 0); the learner must score with the same T.
        max_inflight_per_server: requests one server holds at a time (vLLM batches them).
        max_batch_size: most turns the agent loop hands over in one generation call.
        max_model_len: longest episode context in tokens; longer episodes end as "length" (None:
            the servers' own ``--max-model-len``, smallest of them). Every server must allow it
            (checked at set-up); the memory plan sizes the learner's activations from it.
        request_timeout_s: limit for one generation request; a server that exceeds it is treated
            as gone and its requests run on the others.
        connect_timeout_s: limit for connecting to a server (set-up, and every reconnect).
        learner_host: the address of this machine the servers' workers dial to join the weight
            transfer group (None: the address on the route to this rank's first server).
        weight_sync_bucket_bytes: bytes per broadcast bucket; a publish holds one bucket extra on
            each side (a larger tensor: itself), never a second copy of the weights.
        restart_wait_s: when every server of this rank is gone in the middle of a step, how long to
            wait for one to answer again (restarted by its node's supervisor); it is loaded with the
            latest published weights again and the lost requests rerun on it, exactly. Costs a host
            copy of the latest publish (0: fail at once and keep no copy).
        env_workers: threads for environment calls (reset/step/verdict/close).
        step_timeout_s: limit for one environment reset or step; verdict_timeout_s: for one verdict.
        event_timeout_s: the rollout iterator raises :class:`EngineError` after this long without an
            event; also the limit for a publish's wait for earlier requests, and for its transfer.
            ``"auto"`` (default): as for :class:`~..vllm.config.VLLMEngineConfig` (transfers: 600 s).
    """

    urls: tuple[str, ...]
    temperature: float = 1.0
    max_inflight_per_server: int = 64
    max_batch_size: int = 256
    max_model_len: int | None = None
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    learner_host: str | None = None
    weight_sync_bucket_bytes: int = 256 * 1024 * 1024
    restart_wait_s: float = 0.0
    env_workers: int = 16
    step_timeout_s: float | None = STEP_TIMEOUT_S
    verdict_timeout_s: float | None = VERDICT_TIMEOUT_S
    event_timeout_s: float | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "urls", tuple(self.urls))  # YAML gives a list
        problems: list[str] = []
        if not self.urls:
            problems.append("urls must name at least one vLLM server (http://HOST:PORT)")
        problems += [p for p in map(check_url, self.urls) if p is not None]
        repeated = sorted({u for u in self.urls if self.urls.count(u) > 1})
        if repeated:
            problems.append(f"urls repeat {repeated}: each server once")
        if self.max_model_len is not None and self.max_model_len < 2:
            problems.append(f"max_model_len must be >= 2 or null, got {self.max_model_len}")
        if not self.temperature > 0:
            problems.append(
                f"temperature must be > 0 (got {self.temperature}); greedy decoding has no logprobs"
            )
        for name in ("max_inflight_per_server", "max_batch_size", "env_workers", "weight_sync_bucket_bytes"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.restart_wait_s >= 0:
            problems.append(f"restart_wait_s must be >= 0 seconds, got {self.restart_wait_s}")
        problems += check_event_timeout(self.event_timeout_s)
        for name in ("request_timeout_s", "connect_timeout_s"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if problems:
            raise ConfigError("invalid VLLMServerEngineConfig: " + "; ".join(problems))

    @property
    def sampling(self) -> EngineSampling:
        """softmax(z / T), untruncated; logprobs reported; no teacher."""
        return EngineSampling(self.temperature, logprobs=True)

    @property
    def footprint(self) -> EngineFootprint:
        """The servers run on other machines: on the learner's GPU only the one send bucket of the
        weights' broadcast ("nccl"); episodes bounded by ``max_model_len``."""
        return EngineFootprint(
            max_context_tokens=self.max_model_len,
            weight_sync_buckets=1,
            weight_sync_bucket_bytes=self.weight_sync_bucket_bytes,
        )

    def build(self, model_spec: ModelSpec, tasks: TaskSource) -> VLLMServerEngine:
        """Connect to every server and check it (an unreachable one raises, naming its URL)."""
        from .server_engine import VLLMServerEngine

        return VLLMServerEngine(self, model_spec, tasks)
