"""Engine configurations, constructible from YAML (jsonargparse reads the typed fields).

Each config is a frozen dataclass whose ``__post_init__`` collects every problem and raises one
:class:`~thundersync_lightning.core.errors.ConfigError` (an unknown option raises one too, naming
it: :func:`~thundersync_lightning.core.options.strict_options`); ``build(model_spec, tasks)`` returns
the engine. Example (LightningCLI)::

    engine:
      class_path: thundersync_lightning.rollout.EmbeddedEngineConfig
      init_args: {temperature: 1.0, num_threads: 1, env_workers: 32}
"""

from __future__ import annotations

import math
import multiprocessing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..core.errors import ConfigError
from ..core.options import inapplicable, strict_options
from ..core.protocols import STEP_TIMEOUT_S, VERDICT_TIMEOUT_S, EngineFootprint, EngineSampling, TaskSource
from ..core.types import ModelSpec
from .agent.limits import event_wait_s
from .teacher import TeacherConfig

if TYPE_CHECKING:
    from .embedded.engine import EmbeddedEngine
    from .replay import TraceReplayEngine

__all__ = ["EmbeddedEngineConfig", "TraceReplayEngineConfig"]


# the start methods this platform has, preferred first: forkserver (Linux, macOS), then spawn
_START_METHODS = tuple(m for m in ("forkserver", "spawn") if m in multiprocessing.get_all_start_methods())


def _raise_if(problems: list[str], owner: str) -> None:
    if problems:
        raise ConfigError(f"{owner} is invalid:\n  - " + "\n  - ".join(problems))


@strict_options
@dataclass(frozen=True, slots=True)
class EmbeddedEngineConfig:
    """Settings of :class:`~thundersync_lightning.rollout.EmbeddedEngine`.

    Attributes:
        temperature: sampling temperature T > 0; reported logprobs are ``log_softmax(z / T)``,
            so the learner must divide its logits by the same T.
        top_p: nucleus mass in (0, 1]; reported logprobs are those of the truncated distribution,
            which the learner does not score: top_p < 1 needs the objective's importance correction.
        num_threads: torch intra-op threads of the generation process (keep the learner's cores).
        env_workers: threads for environment calls and verdicts. Verdicts that only wait
            (simulated latency, sandbox subprocesses) need one thread each while waiting.
        device: where the generation copy of the policy lives ("cpu", "cuda:1", ...).
        max_batch_size: most episodes per forward.
        max_context_tokens: episodes whose context would exceed this end as "length".
        step_timeout_s: limit for one ``reset``/``step`` call (failure, reward 0, after it).
        verdict_timeout_s: limit for one verdict (failure, reward 0, after it).
        startup_timeout_s: limit for the process to import, build the model and report ready.
        poll_interval_s: how long one receive waits before a waiting learner re-checks its
            limits (a dead process is noticed at once, independently of it).
        idle_timeout_s: a learner waiting this long without any message raises EngineError, so a
            step never waits forever. ``"auto"`` (default) derives it from the limits that bound
            every event: ``startup_timeout_s + 2 * (max_turns * step_timeout_s + verdict_timeout_s)``
            (:meth:`idle_limit_s`; the factor leaves room for generation); None: wait as long as the
            process lives.
        max_engine_restarts: how many times a generation process that dies (killed, OOM) is
            restarted, with every unfinished request replayed exactly at its frozen version, before
            the engine fails with EngineError (0: fail at the first death and keep no snapshot).
        teacher: on-policy distillation: a second model loaded in the generation process that
            scores every finished trajectory's sampled tokens at ``temperature`` before its
            ContentReady (``Segment.teacher_logprobs``); see :mod:`.teacher`.
        start_method: how the generation process starts: ``"forkserver"`` forks it from
            multiprocessing's fork server, which imports torch, transformers and the model's code
            once per learner process (a start or restart then takes milliseconds); ``"spawn"``
            starts a fresh interpreter each time. See :mod:`.embedded.process`.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    num_threads: int = 1
    env_workers: int = 32
    device: str = "cpu"
    max_batch_size: int = 256
    max_context_tokens: int | None = None
    step_timeout_s: float = STEP_TIMEOUT_S
    verdict_timeout_s: float = VERDICT_TIMEOUT_S
    startup_timeout_s: float = 120.0
    poll_interval_s: float = 0.05
    idle_timeout_s: float | Literal["auto"] | None = "auto"
    max_engine_restarts: int = 1
    teacher: TeacherConfig | None = None
    start_method: Literal["forkserver", "spawn"] = _START_METHODS[0]

    def __post_init__(self) -> None:
        p: list[str] = []
        if self.start_method not in _START_METHODS:
            p.append(
                f"start_method={self.start_method!r}: use one of {list(_START_METHODS)} on this platform"
            )
        if self.teacher is not None and not isinstance(self.teacher, TeacherConfig):
            p.append(f"teacher must be a TeacherConfig or None, got {type(self.teacher).__name__}")
        if not self.temperature > 0:
            p.append(f"temperature={self.temperature}: must be > 0 (greedy decoding is not supported)")
        if not 0 < self.top_p <= 1:
            p.append(f"top_p={self.top_p}: must be in (0, 1]")
        for name in ("num_threads", "env_workers", "max_batch_size"):
            if getattr(self, name) < 1:
                p.append(f"{name}={getattr(self, name)}: must be >= 1")
        if self.max_context_tokens is not None and self.max_context_tokens < 2:
            p.append(f"max_context_tokens={self.max_context_tokens}: must be >= 2 or None")
        for name in ("step_timeout_s", "verdict_timeout_s", "startup_timeout_s", "poll_interval_s"):
            if not getattr(self, name) > 0:
                p.append(f"{name}={getattr(self, name)}: must be > 0 seconds")
        if self.idle_timeout_s not in (None, "auto") and not (
            isinstance(self.idle_timeout_s, (int, float)) and self.idle_timeout_s > 0
        ):
            p.append(f"idle_timeout_s={self.idle_timeout_s!r}: must be > 0 seconds, 'auto' or None")
        if self.max_engine_restarts < 0:
            p.append(f"max_engine_restarts={self.max_engine_restarts}: must be >= 0")
        _raise_if(p, "EmbeddedEngineConfig")

    @property
    def sampling(self) -> EngineSampling:
        """softmax(z / T) with top_p truncation; logprobs reported; a teacher when one is set."""
        return EngineSampling(
            self.temperature, self.top_p, 0, logprobs=True, teacher=self.teacher is not None
        )

    @property
    def footprint(self) -> EngineFootprint:
        """A copy of the policy on ``device`` (the learner's GPU when it is a CUDA device)."""
        on_gpu = self.device.startswith("cuda")
        return EngineFootprint(
            max_context_tokens=self.max_context_tokens, on_learner_device=on_gpu, policy_copies=int(on_gpu)
        )

    def idle_limit_s(self, max_turns: int) -> float | None:
        """Seconds a learner waits for the next event before EngineError (None: no limit)."""
        if self.idle_timeout_s == "auto":
            return event_wait_s(
                max_turns, self.step_timeout_s, self.verdict_timeout_s, self.startup_timeout_s
            )
        return None if self.idle_timeout_s is None else float(self.idle_timeout_s)

    def build(self, model_spec: ModelSpec, tasks: TaskSource) -> EmbeddedEngine:
        """Start the generation process (blocks until it is ready or ``startup_timeout_s``)."""
        from .embedded.engine import EmbeddedEngine

        return EmbeddedEngine(model_spec, tasks, self)


@strict_options
@dataclass(frozen=True, slots=True)
class TraceReplayEngineConfig:
    """Settings of :class:`~thundersync_lightning.rollout.TraceReplayEngine`.

    Times in the trace (or drawn from the distribution) are in abstract units; one unit lasts
    ``time_scale_s`` seconds, typically the learner's measured backward time per trajectory.

    Attributes:
        source: "trace" (read ``trace``), "lognormal" or "pareto".
        trace: a JSON trace path, or the name of a shipped trace ("paper_tail").
        time_scale_s: seconds per trace time unit.
        gen_median / gen_sigma: log-normal generation time (content-ready) of the named
            distributions, in units.
        verdict_median / verdict_sigma: log-normal verdict latency (reward-ready minus
            content-ready) for "lognormal"; for "pareto" the verdict latency is
            ``verdict_median * 2**(-1/alpha) * Pareto(alpha)`` (same median).
        pareto_alpha: tail index of "pareto" (smaller: heavier tail).
        tokens_mean: mean scored tokens per trajectory for the named distributions.
        prompt_tokens: prompt length (shared by a group).
        turns: scored segments per trajectory (observations of ``observation_tokens`` between).
        observation_tokens: unscored tokens between turns.
        reward_p: probability that a trajectory's reward is 1.0 (seeded Bernoulli).
        rollout_slots: trajectories the rollout fleet runs at once (agent + sandbox); each holds a
            slot from its start until its reward is known. None: unlimited. With B*G slots a
            batch issued early (async mode) only starts as the previous batch's tail frees slots.
        token_scale: every drawn ``scored_tokens`` is multiplied by this (rounded, at least 1):
            a trace's schedule with longer trajectories (a compute-bound learner workload).
        setup_fraction: environment set-up (sandbox, workspace, prompt) before a trajectory's
            generation, as a fraction of its generation time ``content_ready``; it needs no
            weights, so a request passed to ``prepare`` ahead of its ``rollout`` has it done then.
    """

    source: Literal["trace", "lognormal", "pareto"] = "trace"
    trace: str = "paper_tail"
    time_scale_s: float = 0.01
    gen_median: float = 4.0
    gen_sigma: float = 0.5
    verdict_median: float = 8.0
    verdict_sigma: float = 1.0
    pareto_alpha: float = 1.5
    tokens_mean: int = 48
    prompt_tokens: int = 16
    turns: int = 2
    observation_tokens: int = 4
    reward_p: float = 0.5
    rollout_slots: int | None = None
    token_scale: float = 1.0
    setup_fraction: float = 0.0

    def __post_init__(self) -> None:
        p: list[str] = []
        if not (self.token_scale > 0 and math.isfinite(self.token_scale)):
            p.append(f"token_scale={self.token_scale}: must be a finite number > 0")
        if not (self.setup_fraction >= 0 and math.isfinite(self.setup_fraction)):
            p.append(f"setup_fraction={self.setup_fraction}: must be a finite number >= 0")
        if self.rollout_slots is not None and self.rollout_slots < 1:
            p.append(f"rollout_slots={self.rollout_slots}: must be >= 1 or None (unlimited)")
        if self.source not in ("trace", "lognormal", "pareto"):
            p.append(f"source={self.source!r}: use 'trace', 'lognormal' or 'pareto'")
        if not self.time_scale_s > 0:
            p.append(f"time_scale_s={self.time_scale_s}: must be > 0")
        for name in ("gen_median", "verdict_median", "pareto_alpha"):
            if not getattr(self, name) > 0:
                p.append(f"{name}={getattr(self, name)}: must be > 0")
        for name in ("gen_sigma", "verdict_sigma"):
            if getattr(self, name) < 0:
                p.append(f"{name}={getattr(self, name)}: must be >= 0")
        for name in ("tokens_mean", "prompt_tokens", "turns"):
            if getattr(self, name) < 1:
                p.append(f"{name}={getattr(self, name)}: must be >= 1")
        if self.observation_tokens < 0:
            p.append(f"observation_tokens={self.observation_tokens}: must be >= 0")
        if not 0 <= self.reward_p <= 1:
            p.append(f"reward_p={self.reward_p}: must be in [0, 1]")
        drawn = ("gen_median", "gen_sigma", "verdict_median", "verdict_sigma", "pareto_alpha", "tokens_mean")
        if self.source == "trace":
            p += inapplicable(self, drawn, "with source='trace' (the trace gives every time and length)")
        else:
            p += inapplicable(self, ("trace",), f"with source={self.source!r} (no trace is read)")
        if self.source == "lognormal":
            p += inapplicable(self, ("pareto_alpha",), "with source='lognormal'")
        if self.source == "pareto":
            p += inapplicable(self, ("verdict_sigma",), "with source='pareto' (the tail is pareto_alpha)")
        _raise_if(p, "TraceReplayEngineConfig")

    @property
    def sampling(self) -> EngineSampling:
        """No model samples: no temperature to compare, no engine logprobs (no importance correction)."""
        return EngineSampling(temperature=None, logprobs=False)

    @property
    def footprint(self) -> EngineFootprint:
        """Nothing on the learner's device; episodes bounded by the task source."""
        return EngineFootprint()

    def build(self, model_spec: ModelSpec, tasks: TaskSource | None = None) -> TraceReplayEngine:
        """The replay engine; token ids are drawn below ``model_spec.config['vocab_size']``."""
        from .replay import TraceReplayEngine

        return TraceReplayEngine(model_spec, self)
