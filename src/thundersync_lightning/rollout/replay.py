"""Trace-replay engine: trajectories on a recorded (or drawn) schedule, for benchmarks.

No model runs. For trajectory (seed, step, g, k) with per-trajectory seed s, a row is drawn
with ``random.Random(s)``: from a trace file (uniformly, with replacement) or from a named
distribution. A row holds, in trace units from the moment the request's generation starts:

    content_ready   c   tokens final (generation time)
    reward_ready    r   verdict known (r >= c)
    scored_tokens   n   number of policy tokens

Wall-clock times are ``start + units * time_scale_s``; a benchmark sets ``time_scale_s`` to the
learner's measured backward time per trajectory so "units" mean "trajectory backwards".
With ``rollout_slots`` set, a trajectory also waits for a free slot (slots free when a verdict
lands), as on a saturated rollout fleet. ``token_scale`` multiplies every row's ``scored_tokens``
(longer trajectories on the same schedule).

Environment set-up (``setup_fraction`` = f): before generating, a trajectory spends f * c units
creating its environment (sandbox, workspace, prompt). That work needs no weights: after
``prepare(request)`` (at time t_p) it runs at once, outside the rollout slots (environments come
from their own pool), and generation begins at ``max(slot free, request start, t_p + f c)``;
without it, generation begins f c after the slot frees. Then, in seconds,

    content_ready_at = generation begin + c * time_scale_s
    reward_ready_at  = content_ready_at + (r - c) * time_scale_s
Requests are generated one after another as by a single engine: a request starts at
``max(issue time, previous request's last content_ready)``; verdicts overlap freely.

The tokens are real, seeded ids below the model's vocabulary (prompt shared by the group,
``turns`` scored segments separated by unscored observations), so the learner can run its
forward/backward on them; engine logprobs are not provided (``Segment.logprobs is None``).
Rewards are seeded Bernoulli(``reward_p``). Every trajectory is tagged with the version
published before ``rollout`` was called.

Synchronous idle fraction (what ``paper_tail.json`` is calibrated to): a learner that waits for
every reward, then runs B*G backwards of one unit each, idles

    idle = E[max_i r_i] / (E[max_i r_i] + B * G * cost)        (per step, averaged over steps)

:func:`sync_idle_fraction` evaluates it by drawing requests exactly as the engine does.
"""

from __future__ import annotations

import heapq
import json
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from torch import Tensor

from ..core.errors import ConfigError, EngineError
from ..core.types import (
    ContentReady,
    ModelSpec,
    RewardReady,
    RolloutEvent,
    RolloutRequest,
    Segment,
    Trajectory,
    derive_seed,
    trajectory_id,
)

if TYPE_CHECKING:  # annotations only: the config builds this engine
    from .config import TraceReplayEngineConfig

__all__ = ["TraceRow", "TraceReplayEngine", "load_trace", "sync_idle_fraction"]


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One trajectory's schedule, in trace units from the start of its request's generation."""

    content_ready: float
    reward_ready: float
    scored_tokens: int


def load_trace(name_or_path: str) -> tuple[TraceRow, ...]:
    """Rows of a JSON trace: a shipped name ("paper_tail") or a path to ``{"rows": [...]}``."""
    path = Path(name_or_path)
    if path.suffix != ".json" and not path.exists():
        text = resources.files(__package__).joinpath("traces", f"{name_or_path}.json")
        if not text.is_file():
            raise ConfigError(
                f"no shipped trace named {name_or_path!r}; give a JSON path or use 'paper_tail'."
            )
        data = json.loads(text.read_text())
    else:
        data = json.loads(path.read_text())
    try:
        rows = tuple(
            TraceRow(float(r["content_ready"]), float(r["reward_ready"]), int(r["scored_tokens"]))
            for r in data["rows"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"trace {name_or_path!r} is malformed ({exc}); expected "
            '{"rows": [{"content_ready": c, "reward_ready": r, "scored_tokens": n}, ...]}'
        ) from exc
    bad = [r for r in rows if not (0 <= r.content_ready <= r.reward_ready and r.scored_tokens >= 1)]
    if not rows or bad:
        raise ConfigError(
            f"trace {name_or_path!r}: need rows with 0 <= content_ready <= reward_ready, tokens >= 1"
        )
    return rows


class _Drawer:
    """Draws a :class:`TraceRow` from a per-trajectory seed, per the config."""

    def __init__(self, config: TraceReplayEngineConfig) -> None:
        self.config = config
        self.rows = load_trace(config.trace) if config.source == "trace" else ()

    def draw(self, rng: random.Random) -> TraceRow:
        cfg = self.config
        if self.rows:
            return self.rows[rng.randrange(len(self.rows))]
        content = cfg.gen_median * math.exp(cfg.gen_sigma * rng.gauss(0.0, 1.0))
        if cfg.source == "lognormal":
            latency = cfg.verdict_median * math.exp(cfg.verdict_sigma * rng.gauss(0.0, 1.0))
        else:
            latency = (
                cfg.verdict_median * 2.0 ** (-1.0 / cfg.pareto_alpha) * rng.paretovariate(cfg.pareto_alpha)
            )
        mean_content = cfg.gen_median * math.exp(cfg.gen_sigma**2 / 2)
        tokens = max(1, round(cfg.tokens_mean * content / mean_content))
        return TraceRow(content, content + latency, tokens)


def sync_idle_fraction(
    config: TraceReplayEngineConfig,
    num_groups: int = 16,
    group_size: int = 8,
    learner_cost: float = 1.0,
    steps: int = 400,
    seed: int = 0,
) -> float:
    """Mean idle fraction of a synchronous learner (see the module docstring), in trace units."""
    drawer = _Drawer(config)
    total = 0.0
    for step in range(steps):
        makespan = max(
            drawer.draw(random.Random(derive_seed(seed, step, g, k))).reward_ready
            for g in range(num_groups)
            for k in range(group_size)
        )
        total += makespan / (makespan + num_groups * group_size * learner_cost)
    return total / steps


class TraceReplayEngine:
    """A :class:`~thundersync_lightning.core.protocols.RolloutEngine` replaying a schedule in-process.

    Args:
        model_spec: gives ``vocab_size`` (``config['vocab_size']`` or the pretrained config).
        config: schedule source and time scale.
        clock: the monotonic clock the schedule is laid on (a seam for tests).
    """

    def __init__(
        self,
        model_spec: ModelSpec,
        config: TraceReplayEngineConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._clock = clock
        self._drawer = _Drawer(self.config)
        self.vocab_size = _vocab_size(model_spec)
        self._version: int | None = None
        self._generation_free_at = 0.0
        n = self.config.rollout_slots
        self._slot_free_at: list[float] | None = None if n is None else [0.0] * n  # a min-heap
        self._prepared: dict[tuple[int, int], float] = {}  # (seed, step) -> when its set-up began
        self._closed = False

    @property
    def version(self) -> int:
        return -1 if self._version is None else self._version

    def publish(self, weights: Mapping[str, Tensor], version: int) -> None:
        """Record ``version`` for requests issued from now on (the weights are not used)."""
        if self._closed:
            raise EngineError("the engine was shut down; build a new one to keep generating.")
        if self._version is not None and version <= self._version:
            raise EngineError(
                f"publish(version={version}) after version {self._version}: versions must increase."
            )
        self._version = int(version)

    def prepare(self, request: RolloutRequest) -> None:
        """Start ``request``'s environment set-up now (no weights needed; see the module docstring)."""
        if self._closed:
            raise EngineError("the engine was shut down; build a new one to keep generating.")
        self._prepared.setdefault((request.seed, request.step), self._clock())

    def rollout(self, request: RolloutRequest) -> Iterator[RolloutEvent]:
        if self._closed:
            raise EngineError("the engine was shut down; build a new one to keep generating.")
        if self._version is None:
            raise EngineError(
                "rollout() before any publish(): call engine.publish(model.state_dict(), version=0)."
            )
        issued = self._clock()
        start = max(issued, self._generation_free_at)
        scale = self.config.time_scale_s
        setup = self.config.setup_fraction
        prepared_at = self._prepared.pop((request.seed, request.step), None)
        slots = self._slot_free_at
        timed: list[tuple[float, int, RolloutEvent]] = []
        last_content = start
        for g in request.groups:
            prompt_rng = random.Random(derive_seed(request.seed, request.step, g.group_index, -1))
            prompt = tuple(prompt_rng.randrange(self.vocab_size) for _ in range(self.config.prompt_tokens))
            for k in range(g.size):
                seed = derive_seed(request.seed, request.step, g.group_index, k)
                rng = random.Random(seed)
                row = self._drawer.draw(rng)
                begin = start if slots is None else max(start, heapq.heappop(slots))
                setup_s = setup * row.content_ready * scale
                begin = begin + setup_s if prepared_at is None else max(begin, prepared_at + setup_s)
                content_at = begin + row.content_ready * scale
                reward_at = begin + row.reward_ready * scale
                if slots is not None:
                    heapq.heappush(slots, reward_at)  # the slot frees when the verdict lands
                last_content = max(last_content, content_at)
                tid = trajectory_id(request.step, g.group_index, k)
                traj = Trajectory(
                    trajectory_id=tid,
                    group_id=g.group_id,
                    sample=k,
                    prompt=prompt,
                    segments=self._segments(rng, row.scored_tokens),
                    policy_version=self._version,
                    num_turns=self.config.turns,
                    finish_reason="submit",
                    submitted_at=issued,
                    content_ready_at=content_at,
                )
                reward = 1.0 if rng.random() < self.config.reward_p else 0.0
                timed.append((content_at, len(timed), ContentReady(traj, content_at)))
                timed.append((reward_at, len(timed), RewardReady(tid, g.group_id, reward, reward_at)))
        self._generation_free_at = last_content
        timed.sort(key=lambda item: (item[0], item[1]))
        return _Schedule(timed, self._clock)

    def shutdown(self) -> None:
        """Nothing runs in the background; later calls raise. Idempotent."""
        self._closed = True

    def _segments(self, rng: random.Random, scored_tokens: int) -> tuple[Segment, ...]:
        scored_tokens = max(1, round(scored_tokens * self.config.token_scale))
        turns = min(self.config.turns, scored_tokens)
        sizes = [scored_tokens // turns + (1 if t < scored_tokens % turns else 0) for t in range(turns)]
        segments: list[Segment] = []
        for t, size in enumerate(sizes):
            if t > 0 and self.config.observation_tokens:
                obs = tuple(rng.randrange(self.vocab_size) for _ in range(self.config.observation_tokens))
                segments.append(Segment(obs, scored=False))
            segments.append(Segment(tuple(rng.randrange(self.vocab_size) for _ in range(size)), scored=True))
        return tuple(segments)


class _Schedule(Iterator[RolloutEvent]):
    """Yields pre-timed events, sleeping until each one's time."""

    def __init__(self, timed: list[tuple[float, int, RolloutEvent]], clock: Callable[[], float]) -> None:
        self._timed = timed
        self._clock = clock
        self._next = 0

    def __next__(self) -> RolloutEvent:
        if self._next >= len(self._timed):
            raise StopIteration
        due, _, event = self._timed[self._next]
        self._next += 1
        delay = due - self._clock()
        if delay > 0:
            time.sleep(delay)
        return event


def _vocab_size(spec: ModelSpec) -> int:
    if "vocab_size" in spec.config:
        return int(spec.config["vocab_size"])
    if spec.pretrained_path is not None:
        from transformers import AutoConfig

        return int(AutoConfig.from_pretrained(spec.pretrained_path, local_files_only=True).vocab_size)
    raise ConfigError(
        "TraceReplayEngine needs ModelSpec.config['vocab_size'] (or a pretrained_path) to draw tokens."
    )
