"""Synchronous collection of one step's rollouts, for training under stock Lightning strategies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from torch import Tensor

from ..core.batches import RolloutBatch
from ..core.errors import GroupError
from ..core.types import ContentReady, RewardReady, Trajectory

__all__ = ["collect_batch", "CollectedBatch"]


class CollectedBatch(NamedTuple):
    """One step's trajectories in (group, sample) order and, per trajectory, its verdict: the reward,
    whether it failed, whether that failure is a host fault, whether every reward declined it."""

    trajectories: list[Trajectory]
    rewards: list[float]
    failed: list[bool]
    host_fault: list[bool]
    unscorable: list[bool]


def collect_batch(
    plan: RolloutBatch, step: int, weights: Mapping[str, Tensor], rank: int = 0, world_size: int = 1
) -> CollectedBatch:
    """Publish ``weights`` as version ``step``, then wait for every trajectory and verdict."""
    engine = plan.engine
    if engine.version != step:
        engine.publish(weights, step)
    request = plan.request(step, rank, world_size)
    content: dict[str, Trajectory] = {}
    rewards: dict[str, RewardReady] = {}
    for event in engine.rollout(request):
        if isinstance(event, ContentReady):
            content[event.trajectory.trajectory_id] = event.trajectory
        else:
            rewards[event.trajectory_id] = event
    expected = [t for ids in request.trajectory_ids().values() for t in ids]
    missing = [t for t in expected if t not in content or t not in rewards]
    if missing:
        raise GroupError(f"step {step}: the engine never completed trajectories {missing[:5]}")
    verdicts = [rewards[t] for t in expected]
    return CollectedBatch(
        [content[t] for t in expected],
        [v.reward for v in verdicts],
        [bool(v.failure) for v in verdicts],
        [bool(v.failure) and v.host_fault for v in verdicts],
        [v.unscorable and not v.failure for v in verdicts],
    )
