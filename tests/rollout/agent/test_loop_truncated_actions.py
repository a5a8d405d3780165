"""Truncated actions: an action the token budget ended before its stop token is counted on the
trajectory, and the objective's overlong filter treats its trajectory as one that hit a length limit."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from thundersync_lightning.core.grpo.terms import TokenScores, mark_truncated
from thundersync_lightning.core.types import GroupRequest, RolloutRequest, Segment, StepResult, Trajectory
from thundersync_lightning.rollout import AgentLoop, EnvPool, Generation, GenerationRequest

from ..helpers import collect

STOP = 9


class _TwoTurns:
    """Two turns of at most 3 tokens that end after token 9; every action is answered with (0,)."""

    max_turns, max_action_tokens, stop_token = 2, 3, STOP

    def tasks(self, step: int, num_groups: int, seed: int) -> list[None]:
        return [None] * num_groups

    def make_env(self, task: None, seed: int) -> _Env:
        return _Env()


class _Env:
    def reset(self) -> tuple[int, ...]:
        return (1,)

    def step(self, action: Sequence[int]) -> StepResult:
        return StepResult((0,), False)

    def verdict(self) -> float:
        return 1.0

    def close(self) -> None:
        pass


def test_the_agent_loop_counts_actions_that_reached_the_budget_without_the_stop_token():
    actions = iter([(5, 6, 7), (5, STOP)])  # turn 1 runs out of budget, turn 2 ends its turn

    def generate(requests: Sequence[GenerationRequest]) -> list[Generation]:
        assert all(r.stop_token == STOP and r.max_new_tokens == 3 for r in requests)
        return [Generation(a, (0.0,) * len(a)) for a in (next(actions) for _ in requests)]

    pool = EnvPool(1)
    events: list = []
    try:
        request = RolloutRequest(0, (GroupRequest("s0-g0", 0, None, 1),), 0)
        assert AgentLoop(_TwoTurns(), generate, pool, coalesce_s=0).run(request, 0, events.append).wait(30)
    finally:
        pool.shutdown()
    traj = collect(events)[0]["s0-g0-t0"]
    assert (traj.num_turns, traj.truncated_actions, traj.finish_reason) == (2, 1, "turn_limit")
    assert traj.truncated


def _trajectory(tid: str, finish: str = "submit", truncated_actions: int = 0) -> Trajectory:
    return Trajectory(tid, "g", 0, (1,), (Segment((2, 3), True),), 0, 1, finish, 0.0, 0.0,
                      truncated_actions=truncated_actions)  # fmt: skip


def test_the_overlong_filter_flags_trajectories_with_a_truncated_action_as_well_as_a_length_finish():
    trajs = [_trajectory("a"), _trajectory("b", finish="length"), _trajectory("c", truncated_actions=1)]
    scores = TokenScores(torch.zeros(3, 2), torch.ones(3, 2, dtype=torch.bool))
    assert mark_truncated(scores, trajs).truncated.tolist() == [False, True, True]
