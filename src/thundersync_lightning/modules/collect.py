"""Synchronous collection of one step's rollouts, for training under stock Lightning strategies."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from ..core.batches import RolloutBatch
from ..core.errors import GroupError
from ..core.types import ContentReady, Trajectory

__all__ = ["collect_batch"]


def collect_batch(
    plan: RolloutBatch, step: int, weights: Mapping[str, Tensor], rank: int = 0, world_size: int = 1
) -> tuple[list[Trajectory], list[float]]:
    """Publish ``weights`` as version ``step``, then wait for every trajectory and reward.

    Returns trajectories in (group, sample) order and their rewards.
    """
    engine = plan.engine
    if engine.version != step:
        engine.publish(weights, step)
    request = plan.request(step, rank, world_size)
    content: dict[str, Trajectory] = {}
    rewards: dict[str, float] = {}
    for event in engine.rollout(request):
        if isinstance(event, ContentReady):
            content[event.trajectory.trajectory_id] = event.trajectory
        else:
            rewards[event.trajectory_id] = event.reward
    expected = [t for ids in request.trajectory_ids().values() for t in ids]
    missing = [t for t in expected if t not in content or t not in rewards]
    if missing:
        raise GroupError(f"step {step}: the engine never completed trajectories {missing[:5]}")
    return [content[t] for t in expected], [rewards[t] for t in expected]
