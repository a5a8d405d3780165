"""``split_backward``: the runner's calls span destinations and take one backward; same gradient."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
import torch

from thundersync_lightning.backends.split import (
    AUTO_MAX_PARAMS,
    CALL_GRADIENT_BYTES,
    SplitBackend,
    choose_backend,
    max_destinations,
    split_problems,
)
from thundersync_lightning.core import (
    ConfigError,
    ContentReady,
    GroupRequest,
    PolicySnapshot,
    RewardReady,
    RolloutRequest,
    Segment,
    StreamingGRPO,
    Trajectory,
)
from thundersync_lightning.core.gradients.backward import PlainBackward
from thundersync_lightning.modules import TINY_QWEN3, GRPOPolicy
from thundersync_lightning.strategy import ThunderSyncStrategy
from thundersync_lightning.strategy.runner import StepRunner

from ...strategy._fit import TOY_MODEL

SIZES = (3, 3, 3)
REQUEST = RolloutRequest(
    step=0, groups=tuple(GroupRequest(f"g{g}", g, None, n) for g, n in enumerate(SIZES)), seed=0
)
IDS = [t for ts in REQUEST.trajectory_ids().values() for t in ts]
OWNER = {t: g for g, ts in REQUEST.trajectory_ids().items() for t in ts}
REWARDS = {t: float(k % 2) for k, t in enumerate(IDS)}
EARLY = [t for t in IDS if OWNER[t] == "g0"] + [IDS[3]]  # group g0 complete, one reward of g1


#: the toy policy (untied) and the default tiny Qwen3, whose output head is its input embedding
MODELS = {"toy": TOY_MODEL, "tied": TINY_QWEN3}


def trajectory(tid: str, vocab: int = TOY_MODEL["vocab_size"]) -> Trajectory:
    g = torch.Generator().manual_seed(sum(map(ord, tid)))
    tokens = tuple(int(x) for x in torch.randint(0, vocab, (2 + len(tid) % 3,), generator=g))
    return Trajectory(tid, OWNER[tid], 0, (1, 2), (Segment(tokens, True),), 0, 1, "stop", 0.0, 0.0)


class Scored(StreamingGRPO):
    """Counts the trajectories added so far, for the event source to wait on."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.changed = threading.Condition()
        self.scored = 0

    def add_tokens(self, ids, *args, **kwargs) -> None:
        super().add_tokens(ids, *args, **kwargs)
        with self.changed:
            self.scored += len(ids)
            self.changed.notify_all()


def events(acc: Scored, scoring: threading.Event, queued: threading.Event, vocab: int) -> Iterator:
    """The first content alone; once the learner scores it, every other content and the early
    rewards; once the learner scored every content, the rest."""
    yield ContentReady(trajectory(IDS[0], vocab), 0.0)
    assert scoring.wait(60)  # runs when the pump asks for the next event: the learner took the first alone
    for tid in IDS[1:]:
        yield ContentReady(trajectory(tid, vocab), 0.0)
    for tid in EARLY:
        yield RewardReady(tid, OWNER[tid], REWARDS[tid], 0.0)
    queued.set()  # runs when the pump asks for the next event: the ones above are queued
    with acc.changed:
        assert acc.changed.wait_for(lambda: acc.scored == len(IDS), timeout=60)
    for tid in IDS:
        if tid not in EARLY:
            yield RewardReady(tid, OWNER[tid], REWARDS[tid], 0.0)


def run(split: bool, config: dict = TOY_MODEL):
    """One step: the first call scores one trajectory while the rest of the first events queue up,
    so the second call finds direct rows, a bucket and reward-pending rows together."""
    torch.manual_seed(0)
    policy = GRPOPolicy(config=config)
    params = [p for p in policy.parameters() if p.requires_grad]
    backend = choose_backend(split, policy, params, "streaming", False, "none")
    acc = Scored(params, backend=backend)
    scoring, queued = threading.Event(), threading.Event()

    def score(trajectories, prefix=None, watch=None):
        scoring.set()
        assert queued.wait(60)
        return policy.score_tokens(trajectories, watch=watch)

    runner = StepRunner(REQUEST, PolicySnapshot(policy), acc, score)
    outcome = runner.run(events(acc, scoring, queued, config["vocab_size"]))
    report = acc.finish()
    grad = torch.cat([p.grad.reshape(-1) for p in params]).clone()
    calls = [(iv.path, iv.trajectories) for iv in outcome.busy if iv.kind == "backward"]
    return grad, report.backward_passes, calls, backend


@pytest.mark.parametrize("model", list(MODELS))
def test_one_split_call_takes_every_destination_and_applies_the_same_gradient(model):
    per_job, jobs, calls, _ = run(split=False, config=MODELS[model])
    split, passes, split_calls, backend = run(split=True, config=MODELS[model])
    assert calls[0] == split_calls[0] == ("held", 1)
    # without the split each destination's work is its own call; with it, one call for the rest
    assert split_calls[1:] == [("direct", 8)]
    assert len(calls) > 2
    assert isinstance(backend, SplitBackend) and backend.verified
    assert passes == 2 < jobs  # the lone first call and the split call
    assert float((split - per_job).norm() / per_job.norm()) <= 1e-5


def test_the_option_is_checked_and_required_where_asked_for(caplog):
    with pytest.raises(ConfigError, match="split_backward='yes' is not one of"):
        ThunderSyncStrategy(split_backward="yes")
    with pytest.raises(ConfigError, match="split_backward=True and boundary_cut=True"):
        ThunderSyncStrategy(split_backward=True, boundary_cut=True)
    policy = GRPOPolicy(config=TOY_MODEL)
    params = list(policy.parameters())
    assert split_problems(policy, params, "streaming", False, "none") == []
    assert isinstance(choose_backend("auto", policy, params, "streaming", False, "none"), SplitBackend)
    assert isinstance(choose_backend(False, policy, params, "streaming", False, "none"), PlainBackward)

    class NoCapture(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(2, 2)

        def score_tokens(self, trajectories, *, entropy=False, reference=False):
            raise AssertionError("not called")

    plain = NoCapture()
    problems = split_problems(plain, list(plain.parameters()), "streaming", False, "fsdp2")
    assert any("takes no watch=" in p for p in problems) and any("fsdp2" in p for p in problems)
    with caplog.at_level(logging.INFO, logger="thundersync_lightning.backends.split.choice"):
        assert isinstance(
            choose_backend("auto", plain, list(plain.parameters()), "streaming", False, "none"), PlainBackward
        )
        assert isinstance(
            choose_backend("auto", plain, list(plain.parameters()), "sync", False, "none"), PlainBackward
        )
    # a streaming fit that will not split says why, once; sync never splits and says nothing
    assert [r.getMessage() for r in caplog.records] == [
        "split_backward='auto' leaves the split off: NoCapture.score_tokens takes no watch= "
        "(see GRPOPolicy.score_tokens)"
    ]
    with pytest.raises(ConfigError, match="split_backward=True cannot be used: NoCapture.score_tokens"):
        choose_backend(True, plain, list(plain.parameters()), "streaming", False, "none")
    assert isinstance(
        choose_backend(True, policy, params, "sync", False, "none"), PlainBackward
    )  # nothing to split

    class OldCapture(NoCapture):
        def score_tokens(self, trajectories, *, entropy=False, reference=False, capture=None):
            raise AssertionError("not called")

    old = OldCapture()
    assert any(
        "capture= keyword is now called watch=" in p
        for p in split_problems(old, [], "streaming", False, "none")
    )


def test_auto_splits_small_models_only_and_each_call_holds_a_bounded_number_of_gradients(caplog):
    small = GRPOPolicy(config=TOY_MODEL)
    wide = GRPOPolicy(config={**TOY_MODEL, "hidden_size": 512, "intermediate_size": 2048, "head_dim": 64})
    for policy, splits in ((small, True), (wide, False)):
        params = list(policy.parameters())
        assert (sum(p.numel() for p in params) > AUTO_MAX_PARAMS) is not splits
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="thundersync_lightning.backends.split.choice"):
            chosen = choose_backend("auto", policy, params, "streaming", False, "none")
            assert isinstance(chosen, SplitBackend) is splits
        assert any("trainable parameters > 1000000" in r.getMessage() for r in caplog.records) is not splits
        assert isinstance(
            choose_backend(True, policy, params, "streaming", False, "none"), SplitBackend
        )  # required
    assert max_destinations([torch.zeros(10)]) == CALL_GRADIENT_BYTES // 40
    assert max_destinations([torch.zeros(2**30)]) == 2  # 4 GiB of gradients: never fewer than two
