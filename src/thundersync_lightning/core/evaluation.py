"""Evaluation on held-out tasks: plans for Lightning's validation loop, pass@k, typed outcomes.

The validation dataloader yields :class:`ValidationBatch` tickets (like training's
:class:`~thundersync_lightning.strategy.RolloutBatch`: no data, so prefetching is harmless). The
strategy's ``validation_step`` publishes the current weights, runs the plan's request through the
same engine and environments as training, waits for every verdict (no accumulator, no backward:
nothing is scored by the learner) and hands a :class:`ValidationOutcome` to the module, which
logs :meth:`ValidationOutcome.metrics`. Every validation trajectory must come from the weights
being evaluated (staleness 0, checked).

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1): with n
samples of a task of which c pass, the unbiased estimate of the probability that at least one of
k samples passes is

    pass@k = 1 - C(n - c, k) / C(n, k)      (k <= n; 1 when n - c < k)

computed as ``1 - prod_{i = n-c+1}^{n} (1 - k / i)`` (no large binomials). The metric is its mean
over tasks; pass@1 reduces to c / n.

Validation requests use negative step numbers (``-1 - batch_index``): their trajectory ids never
collide with training's, and their sampling seeds are the same at every evaluation, so two
evaluations of different weights differ by the weights, not by the dice.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, GroupError, StalenessError
from .protocols import RolloutEngine
from .types import ContentReady, GroupRequest, RolloutEvent, RolloutRequest, group_id

__all__ = [
    "VALIDATION_METRICS",
    "ValidationBatch",
    "ValidationLoader",
    "ValidationOutcome",
    "pass_at_k",
    "collect_validation",
]

# (name without the ``val/`` prefix, what its mean is over): the weights of exact cross-batch means
VALIDATION_METRICS: dict[str, str] = {
    "pass_at_1": "tasks",
    "pass_at_k": "tasks",
    "reward_mean": "trajectories",
    "turns_mean": "trajectories",
    "failed_fraction": "trajectories",
}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with ``n`` samples, ``c`` of them passing (see the module docstring)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


class ValidationBatch:
    """One validation batch: ``tasks`` (held-out payloads), ``samples`` trajectories each.

    A plain class (not a dataclass): Lightning's batch transfer would try to copy a dataclass.
    """

    __slots__ = ("tasks", "engine", "samples", "seed", "batch_index", "pass_k", "pass_threshold")

    def __init__(
        self,
        tasks: Sequence[Any],
        engine: RolloutEngine,
        samples: int,
        seed: int,
        batch_index: int,
        pass_k: int,
        pass_threshold: float,
    ) -> None:
        self.tasks = tuple(tasks)
        self.engine = engine
        self.samples = samples
        self.seed = seed
        self.batch_index = batch_index
        self.pass_k = pass_k
        self.pass_threshold = pass_threshold

    @property
    def step(self) -> int:
        """The request's step number: negative, so ids and seeds never meet training's."""
        return -1 - self.batch_index

    def request(self, rank: int = 0, world_size: int = 1) -> RolloutRequest:
        """This rank's share: task i goes to rank ``i % world_size``."""
        groups = tuple(
            GroupRequest(group_id(self.step, i), i, task, self.samples)
            for i, task in enumerate(self.tasks)
            if i % world_size == rank
        )
        return RolloutRequest(step=self.step, groups=groups, seed=self.seed)


class ValidationLoader:
    """The validation "dataloader": the held-out tasks in chunks of ``groups`` per plan."""

    def __init__(
        self,
        tasks: Sequence[Any],
        engine: RolloutEngine,
        samples: int,
        groups: int,
        seed: int,
        pass_k: int,
        pass_threshold: float,
    ) -> None:
        if samples < 1 or groups < 1 or not 1 <= pass_k <= samples:
            raise ConfigError(
                f"ValidationLoader: need samples >= 1, groups >= 1 and 1 <= pass_k <= samples; got "
                f"samples={samples}, groups={groups}, pass_k={pass_k}"
            )
        tasks = list(tasks)
        self.plans = [
            ValidationBatch(tasks[i : i + groups], engine, samples, seed, b, pass_k, pass_threshold)
            for b, i in enumerate(range(0, len(tasks), groups))
        ]

    def __len__(self) -> int:
        return len(self.plans)

    def __iter__(self) -> Iterator[ValidationBatch]:
        return iter(self.plans)


@dataclass(frozen=True, slots=True)
class ValidationOutcome:
    """What one validation batch found on this rank.

    ``passed[i]`` / ``samples`` per task; ``rewards`` and ``turns`` per trajectory; ``failures``
    counts trajectories whose rollout failed (reward 0, counted as not passing).
    """

    samples: int
    pass_k: int
    passed: tuple[int, ...]
    rewards: tuple[float, ...]
    turns: tuple[int, ...]
    failures: int

    @property
    def num_tasks(self) -> int:
        return len(self.passed)

    def metrics(self) -> dict[str, float]:
        """Means over this batch's tasks/trajectories (keys without the ``val/`` prefix)."""
        n, k = self.samples, self.pass_k
        if not self.passed:
            return {}
        return {
            "pass_at_1": sum(pass_at_k(n, c, 1) for c in self.passed) / len(self.passed),
            "pass_at_k": sum(pass_at_k(n, c, k) for c in self.passed) / len(self.passed),
            "reward_mean": sum(self.rewards) / len(self.rewards),
            "turns_mean": sum(self.turns) / len(self.turns),
            "failed_fraction": self.failures / len(self.rewards),
        }

    def weighted_metrics(self) -> dict[str, tuple[float, int]]:
        """Every metric of :data:`VALIDATION_METRICS` as (this batch's mean, its weight: the number
        of tasks or trajectories it averages), ``(0.0, 0)`` for an empty batch. Weighted means over
        batches and ranks then give the metric of the whole held-out set, however unevenly the
        tasks were split (a rank may get none of a batch's tasks)."""
        means = self.metrics()
        sizes = {"tasks": self.num_tasks, "trajectories": len(self.rewards)}
        return {name: (means.get(name, 0.0), sizes[over]) for name, over in VALIDATION_METRICS.items()}


def collect_validation(
    plan: ValidationBatch, request: RolloutRequest, events: Iterator[RolloutEvent], version: int
) -> ValidationOutcome:
    """Wait for every event of ``request`` (issued from ``plan`` to an engine holding ``version``)."""
    content: dict[str, Any] = {}
    rewards: dict[str, float] = {}
    failed: set[str] = set()
    for event in events:
        if isinstance(event, ContentReady):
            t = event.trajectory
            if t.policy_version != version:
                raise StalenessError(
                    f"validation trajectory {t.trajectory_id!r} was generated by policy version "
                    f"{t.policy_version}, not the evaluated version {version}: the engine did not receive "
                    "the published weights before generating"
                )
            content[t.trajectory_id] = t
        else:
            rewards[event.trajectory_id] = event.reward
            if event.failure:
                failed.add(event.trajectory_id)
    members = request.trajectory_ids()
    missing = [t for ids in members.values() for t in ids if t not in content or t not in rewards]
    if missing:
        raise GroupError(f"validation batch {plan.batch_index}: the engine never completed {missing[:5]}")
    passed = tuple(
        sum(1 for t in ids if t not in failed and rewards[t] >= plan.pass_threshold)
        for ids in members.values()
    )
    order = [t for ids in members.values() for t in ids]
    return ValidationOutcome(
        samples=plan.samples,
        pass_k=plan.pass_k,
        passed=passed,
        rewards=tuple(rewards[t] for t in order),
        turns=tuple(content[t].num_turns for t in order),
        failures=len(failed),
    )
