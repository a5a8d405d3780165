"""An environment failure is never better than a 0: only faults no action can cause may be dropped.

Before: every failure (a step that raised because of what the model wrote, a verdict that raised
on a workspace the agent had filled) was a failed trajectory that ``failed="drop"`` removed from
its group, so an agent expecting a 0 could learn to crash its environment instead. Now a failure
is marked ``host_fault`` only when nothing has acted yet (a reset) or the call raised
:class:`HostFault`; every other failure keeps its reason and trains as a reward of 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from thundersync_lightning.core import (
    ContentReady,
    GroupRequest,
    Objective,
    PolicySnapshot,
    RewardReady,
    RolloutRequest,
    Segment,
    StreamingGRPO,
    Trajectory,
)
from thundersync_lightning.rollout import AgentLoop, EnvPool, Generation, GenerationRequest, make_request
from thundersync_lightning.strategy.runner import StepRunner

from ...strategy.test_runner_held_bound import VOCAB, TinyPolicy
from ..helpers import collect
from ..scripted import RELEASE, ScriptedTasks

pytestmark = pytest.mark.timeout(60)


def _guess(requests: Sequence[GenerationRequest]) -> list[Generation]:
    return [Generation((0,) * r.max_new_tokens, (0.0,) * r.max_new_tokens) for r in requests]


@pytest.mark.parametrize(
    ("mode", "host_fault", "reason"),
    [
        ("reset_raises", True, "reset raised RuntimeError"),  # nothing acted yet
        ("step_raises", False, "step raised ValueError: tool crashed"),
        ("step_host_fault", True, "step raised HostFault"),
        ("step_stuck", False, "step timed out"),
        ("verdict_raises", False, "verdict raised RuntimeError"),
        ("verdict_host_fault", True, "verdict raised HostFault"),
        ("verdict_nan", False, "verdict returned nan"),
    ],
)
def test_only_a_fault_no_action_can_cause_is_marked_droppable(mode, host_fault, reason):
    tasks = ScriptedTasks(modes=(mode,), max_turns=1)
    pool = EnvPool(4)
    events: list = []
    RELEASE.clear()
    try:
        loop = AgentLoop(tasks, _guess, pool, step_timeout_s=0.5)
        assert loop.run(make_request(tasks, 0, 1, 2, 0), 0, events.append).wait(timeout=30)
    finally:
        RELEASE.set()
        pool.shutdown()
    _, rewards, _ = collect(events)
    assert {(r.reward, r.host_fault) for r in rewards.values()} == {(0.0, host_fault)}
    assert all(reason in r.failure for r in rewards.values())


REQ = RolloutRequest(0, (GroupRequest("s0-g0", 0, None, 3),), 0)
REWARDS = {"s0-g0-t0": 1.0, "s0-g0-t1": 0.5, "s0-g0-t2": 0.0}


def _trajectory(tid: str, failure: str | None = None) -> Trajectory:
    g = torch.Generator().manual_seed(sum(map(ord, tid)))
    action = tuple(int(x) for x in torch.randint(0, VOCAB, (4,), generator=g))
    return Trajectory(
        tid,
        "s0-g0",
        0,
        (1, 2),
        (Segment(action, True),),
        0,
        1,
        "failure" if failure else "stop",
        0.0,
        0.0,
        failure=failure,
    )


def _gradient(last: RewardReady) -> torch.Tensor:
    """The step's gradient under failed="drop" when t2's reward event is ``last``."""
    policy = TinyPolicy()
    acc = StreamingGRPO(list(policy.parameters()), objective=Objective(failed="drop"))
    events = [
        ContentReady(_trajectory(t, last.failure if t == last.trajectory_id else None), 0.0) for t in REWARDS
    ]
    events += [RewardReady(t, "s0-g0", REWARDS[t], 0.0) for t in ("s0-g0-t0", "s0-g0-t1")] + [last]
    StepRunner(REQ, PolicySnapshot(policy), acc, policy.score).run(iter(events))
    acc.finish()
    return policy.logits.grad.clone()


def test_under_drop_a_failure_the_episode_caused_trains_at_the_floor_and_only_a_host_fault_leaves():
    graded_worst = _gradient(RewardReady("s0-g0-t2", "s0-g0", 0.5, 0.0))  # the worst graded reward of t0, t1
    crashed = _gradient(RewardReady("s0-g0-t2", "s0-g0", 0.0, 0.0, "step raised ValueError: NUL byte"))
    host = _gradient(RewardReady("s0-g0-t2", "s0-g0", 0.0, 0.0, "reset raised OSError", host_fault=True))
    assert torch.allclose(
        crashed, graded_worst, rtol=1e-12, atol=1e-15
    )  # before: the crash left the group (= host)
    assert not torch.allclose(host, graded_worst)


def test_the_steps_records_mark_a_host_fault_and_only_a_host_fault():
    policy = TinyPolicy()
    acc = StreamingGRPO(list(policy.parameters()), objective=Objective(failed="drop"))
    events = [ContentReady(_trajectory(t, "failed" if t != "s0-g0-t0" else None), 0.0) for t in REWARDS]
    events += [
        RewardReady("s0-g0-t0", "s0-g0", 1.0, 0.0),
        RewardReady("s0-g0-t1", "s0-g0", 0.0, 0.0, "step raised ValueError: NUL byte"),
        RewardReady(
            "s0-g0-t2", "s0-g0", 0.0, 0.0, "step raised HostFault: sandbox host went away", host_fault=True
        ),
    ]
    outcome = StepRunner(REQ, PolicySnapshot(policy), acc, policy.score).run(iter(events))
    acc.finish()
    marks = {r.trajectory_id: (r.failure is not None, r.host_fault) for r in outcome.records(0)}
    assert marks == {"s0-g0-t0": (False, False), "s0-g0-t1": (True, False), "s0-g0-t2": (True, True)}
