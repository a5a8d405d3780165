"""min_batch_trajectories: while content is still to land, a learner call starts only once enough rows wait.

The step runner is driven by fuzzed event orders (the tiny bigram policy of ``test_runner_held_bound``,
float64). The property checked at every ``add_tokens`` call: if the engine had content still to
deliver and no group was deferred, at least ``min_batch_trajectories`` rows were waiting. The
gradient must equal the one without the wait.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thundersync_lightning.core import PolicySnapshot, StreamingGRPO
from thundersync_lightning.strategy.runner import RunnerSettings, StepRunner

from .test_runner_held_bound import TinyPolicy, event, request


class Observed(StreamingGRPO):
    """Records, at every call, what the runner knew: rows waiting, content delivered, groups deferred."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.runner: StepRunner | None = None
        self.calls: list[tuple[int, int, bool]] = []
        self.waiting_tokens: list[int] = []
        self.outcome = None
        self.called = threading.Event()

    def add_tokens(self, tids, *args, **kwargs) -> None:
        r = self.runner
        assert r is not None
        self.calls.append((len(r._waiting), len(r.outcome.trajectories), r.intake.has_deferred))
        self.waiting_tokens.append(sum(len(r.outcome.trajectories[t].tokens) for t in r._waiting))
        super().add_tokens(tids, *args, **kwargs)
        self.called.set()


def run(order, sizes, rewards, least: int, source=None, rows: int = 32, tokens: int | None = None, **bounds):
    policy = TinyPolicy()
    req = request(sizes)
    acc = Observed(list(policy.parameters()), **bounds)
    settings = RunnerSettings(
        min_batch_trajectories=least, max_batch_trajectories=rows, max_batch_tokens=tokens
    )
    runner = StepRunner(req, PolicySnapshot(policy), acc, policy.score, settings)
    acc.runner = runner
    owner = {t: g for g, ts in req.trajectory_ids().items() for t in ts}
    events = source(order, owner, acc) if source else iter([event(k, t, owner[t], rewards) for k, t in order])
    outcome = runner.run(events)
    acc.finish()
    acc.outcome = outcome
    return policy.logits.grad.clone(), acc.calls, acc


@st.composite
def steps(draw):
    sizes = draw(st.lists(st.integers(2, 4), min_size=1, max_size=3))
    ids = [t for ts in request(sizes).trajectory_ids().values() for t in ts]
    rewards = {t: float(draw(st.sampled_from([0.0, 1.0, 0.5]))) for t in ids}
    order = draw(st.permutations([(k, t) for t in ids for k in ("content", "reward")]))
    return sizes, rewards, order


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    step=steps(),
    least=st.integers(1, 6),
    rows=st.integers(1, 4),
    tokens=st.sampled_from([None, 5, 10, 15]),  # every trajectory has 5 tokens (2 prompt, 3 action)
    open_groups=st.sampled_from([None, 1]),
)
def test_no_call_starts_with_fewer_rows_than_the_wait_while_content_is_to_come(
    step, least, rows, tokens, open_groups
):
    sizes, rewards, order = step
    total = sum(sizes)
    caps = dict(rows=rows, tokens=tokens, max_open_groups=open_groups)
    waited, calls, acc = run(order, sizes, rewards, least, **caps)
    at_once, _, _ = run(order, sizes, rewards, 1, **caps)
    for (waiting, delivered, deferred), waiting_tokens in zip(calls, acc.waiting_tokens, strict=True):
        if delivered < total and not deferred:  # the wait ends at the row cap or the token cap too
            assert waiting >= min(least, rows) or (tokens is not None and waiting_tokens >= tokens), calls
    assert sum(iv.trajectories for iv in acc.outcome.busy if iv.kind == "backward") == total
    scale = float(at_once.abs().max()) or 1.0
    assert float((waited - at_once).abs().max()) / scale <= 1e-12


def test_a_wait_longer_than_the_step_ends_when_the_last_content_lands():
    sizes = [4]
    ids = list(request(sizes).trajectory_ids().values())[0]
    rewards = dict.fromkeys(ids, 1.0)
    order = [("reward", t) for t in ids] + [("content", t) for t in ids]
    # the wait exceeds the group: the learner starts when the last content lands (every reward
    # known by then: one direct call of all 4)
    _, calls, acc = run(order, sizes, rewards, 6)
    assert [iv.trajectories for iv in acc.outcome.busy if iv.kind == "backward"] == [4]
    assert calls == [(4, 4, False)]


def test_a_deferred_group_lets_the_learner_work_instead_of_waiting_for_rows_that_need_its_work():
    # one open group at a time: g1's content waits for g0 to close, which takes the learner's work
    sizes = [2, 2]
    ids = [t for ts in request(sizes).trajectory_ids().values() for t in ts]
    rewards = dict(zip(ids, [1.0, 0.0, 1.0, 0.0]))

    def source(order, owner, acc: Observed) -> Iterator:
        for kind, tid in order:
            yield event(kind, tid, owner[tid], rewards)
        # g1's last content only after the learner has worked: a learner that waited for 4 rows
        # would never start (the wait below fails instead of hanging the test)
        assert acc.called.wait(timeout=60), "the learner waited for rows while a group was deferred"
        yield event("content", ids[3], owner[ids[3]], rewards)
        yield event("reward", ids[3], owner[ids[3]], rewards)

    early = [("content", ids[0]), ("content", ids[1]), ("content", ids[2]), ("reward", ids[2])]
    early += [("reward", ids[0]), ("reward", ids[1])]
    grad, calls, _ = run(early, sizes, rewards, 4, source=source, max_open_groups=1)
    assert calls[0][2]  # the first call was made while g1 was deferred
    full = early + [("content", ids[3]), ("reward", ids[3])]
    at_once, _, _ = run(full, sizes, rewards, 1, max_open_groups=1)
    assert float((grad - at_once).abs().max()) / float(at_once.abs().max()) <= 1e-12
