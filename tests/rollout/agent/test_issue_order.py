"""IssueOrder: a publish waits for the rollouts issued before it, and only for those."""

from __future__ import annotations

import threading

import pytest

from thundersync_lightning.core.errors import EngineError
from thundersync_lightning.core.types import GroupRequest, RolloutRequest, group_id
from thundersync_lightning.rollout.agent.issue_order import IssueOrder

from ..procs import wait_until


def request(step: int) -> RolloutRequest:
    return RolloutRequest(step=step, groups=(GroupRequest(group_id(step, 0), 0, None, 1),), seed=0)


class Gated:
    """A run that emits its two events only once its step's gate opens; records the versions issued."""

    def __init__(self) -> None:
        self.gates: dict[int, threading.Event] = {}
        self.versions: dict[int, int] = {}

    def __call__(self, req: RolloutRequest, version: int, emit, submitted_at: float) -> None:
        self.versions[req.step] = version
        assert self.gates.setdefault(req.step, threading.Event()).wait(timeout=60)
        emit(("content", req.step))
        emit(("reward", req.step))


def test_a_publish_waits_for_the_earlier_rollout_and_a_later_rollout_gets_the_new_version():
    run = Gated()
    run.gates[0] = threading.Event()
    order = IssueOrder(run, event_timeout_s=60, owner="TestConfig", thread_name="test")
    version = {"v": 0}
    events = order.rollout(request(0), lambda: version["v"])
    published = threading.Event()

    def publish() -> None:
        with order.lock:
            order.wait_idle(1)
            version["v"] = 1
        published.set()

    threading.Thread(target=publish, daemon=True).start()
    assert wait_until(lambda: order.lock.locked() or published.is_set(), deadline_s=60)
    assert not published.is_set()  # it holds the lock, blocked in wait_idle: step 0 is generating
    run.gates[0].set()
    assert list(events) == [("content", 0), ("reward", 0)]
    assert published.wait(timeout=60)
    run.gates[1] = threading.Event()
    run.gates[1].set()
    assert list(order.rollout(request(1), lambda: version["v"])) == [("content", 1), ("reward", 1)]
    assert run.versions == {0: 0, 1: 1}


def test_a_rollout_that_cannot_be_issued_raises_at_once_and_counts_as_nothing_generating():
    order = IssueOrder(Gated(), event_timeout_s=60, owner="TestConfig", thread_name="test")

    def refuse() -> int:
        raise EngineError("refusing to generate: no weights published yet")

    with pytest.raises(EngineError, match="no weights published"):
        order.rollout(request(0), refuse)
    with order.lock:
        order.wait_idle(0)  # returns at once


def test_a_run_that_raises_fails_the_iterator_naming_the_step():
    def crash(req, version, emit, submitted_at):
        raise RuntimeError("an environment exploded")

    order = IssueOrder(crash, event_timeout_s=60, owner="TestConfig", thread_name="test")
    with pytest.raises(EngineError, match="the rollout of step 3 failed: an environment exploded"):
        list(order.rollout(request(3), lambda: 0))
