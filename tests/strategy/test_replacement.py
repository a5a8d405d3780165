"""Dynamic sampling in the step runner: an uninformative group is replaced from the reserve the
moment its last verdict lands, every mode issues the same replacements, and the gradient is the
one over the kept groups."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch

from thundersync_lightning.core import GroupError, GroupRequest, PolicySnapshot, RolloutRequest, StreamingGRPO
from thundersync_lightning.strategy.runner import Replacements, RunnerSettings, StepRunner

from .test_runner_held_bound import TinyPolicy, event

# group index -> rewards of its 3 members; 0, 2 and 3 carry no signal
REWARDS = {
    0: (1.0, 1.0, 1.0),
    1: (1.0, 0.0, 0.0),
    2: (0.0, 0.0, 0.0),
    3: (0.5, 0.5, 0.5),
    4: (0.0, 1.0, 1.0),
    5: (0.0, 0.5, 1.0),
    6: (1.0, 0.0, 1.0),
}


def group(i: int) -> GroupRequest:
    return GroupRequest(f"s0-g{i}", i, None, 3)


def events_of(req: RolloutRequest, seed: int) -> Iterator:
    """Every content and reward event of ``req`` in a seeded shuffled order
    (contents first per trajectory)."""
    rewards = {
        t: REWARDS[g.group_index][k]
        for g in req.groups
        for k, t in enumerate(req.trajectory_ids()[g.group_id])
    }
    owner = {t: g for g, ts in req.trajectory_ids().items() for t in ts}
    order = [("content", t) for t in owner] + [("reward", t) for t in owner]
    random.Random(seed).shuffle(order)
    return iter([event(kind, tid, owner[tid], rewards) for kind, tid in order])


def run(defer: bool, reserve: int, seed: int = 0):
    policy = TinyPolicy()
    acc = StreamingGRPO(list(policy.parameters()), filter_groups=True)
    req = RolloutRequest(step=0, groups=(group(0), group(1), group(2)), seed=0)
    issued: list[int] = []

    def issue(r: RolloutRequest) -> Iterator:
        issued.extend(g.group_index for g in r.groups)
        return events_of(r, seed + len(issued))

    replacements = Replacements(tuple(group(i) for i in range(3, 3 + reserve)), issue)
    runner = StepRunner(
        req, PolicySnapshot(policy), acc, policy.score, RunnerSettings(defer=defer), replacements=replacements
    )
    outcome = runner.run(events_of(req, seed))
    report = acc.finish()
    return policy.logits.grad.clone(), report, outcome, issued


def barrier_over(groups: list[int]) -> torch.Tensor:
    """One backward of the loss over the given groups (drgrpo-free: GRPO, population std, group-sum)."""
    from thundersync_lightning.core import Objective

    from .test_runner_held_bound import trajectory

    policy, obj = TinyPolicy(), Objective()
    loss = torch.zeros((), dtype=torch.float64)
    for i in groups:
        tids = [f"s0-g{i}-t{k}" for k in range(3)]
        scores = policy.score([trajectory(t, f"s0-g{i}") for t in tids])
        s = (scores.logprobs * scores.mask).sum(-1)
        loss = loss - (obj.advantages(torch.tensor(REWARDS[i], dtype=torch.float64)) * s).sum()
    (loss / len(groups)).backward()
    return policy.logits.grad.clone()


@pytest.mark.parametrize("seed", range(4))
def test_replacements_are_issued_until_the_step_holds_its_informative_groups(seed):
    streamed, report, outcome, issued = run(defer=False, reserve=4, seed=seed)
    # g0 and g2 have no signal: two replacements; the first (g3) has none either: a third (g5 after g4)
    assert issued == [3, 4, 5]
    assert (outcome.groups_generated, outcome.groups_filtered) == (6, 3)
    assert (report.groups_folded, report.groups_filtered) == (3, 3)
    expected = barrier_over([1, 4, 5])
    assert float((streamed - expected).norm() / expected.norm()) <= 1e-12
    synced, sync_report, sync_outcome, sync_issued = run(defer=True, reserve=4, seed=seed)
    assert sync_issued == issued and sync_outcome.groups_generated == 6
    assert float((synced - expected).norm() / expected.norm()) <= 1e-12


def test_the_reserve_bounds_the_extra_generation():
    grad, report, outcome, issued = run(defer=False, reserve=1)
    assert issued == [3]  # g3 has no signal either, and the reserve is spent
    assert (outcome.groups_generated, outcome.groups_filtered, report.groups_folded) == (4, 3, 1)
    expected = barrier_over([1])
    assert float((grad - expected).norm() / expected.norm()) <= 1e-12


def test_a_reserve_without_a_filtering_accumulator_is_refused():
    policy = TinyPolicy()
    req = RolloutRequest(step=0, groups=(group(0),), seed=0)
    with pytest.raises(GroupError, match="replacement groups need an accumulator with filter_groups"):
        StepRunner(
            req,
            PolicySnapshot(policy),
            StreamingGRPO(list(policy.parameters())),
            policy.score,
            replacements=Replacements((group(1),), lambda r: iter(())),
        )


def _fit(mode: str, steps: int = 2, **data_kwargs):
    import lightning as L

    from thundersync_lightning.core import Objective
    from thundersync_lightning.envs.toy import GuessingGameTasks
    from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
    from thundersync_lightning.rollout import EmbeddedEngineConfig
    from thundersync_lightning.strategy import ThunderSyncStrategy

    from ._fit import TOY_MODEL, RecordSteps
    from .test_objective_checks_modes import GradientAtBarrier

    L.seed_everything(0)
    objective = Objective(loss_agg="token-mean", kl_coef=0.05, entropy_coef=0.01)  # R terms: per-group R sums
    policy = GRPOPolicy(config=TOY_MODEL, objective=objective, dtype="float64")  # arrival order: float64
    grads, record = GradientAtBarrier(), RecordSteps()
    trainer = L.Trainer(
        strategy=ThunderSyncStrategy(mode=mode),
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[grads, record],
    )
    data = RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"),
        engine=EmbeddedEngineConfig(num_threads=1, env_workers=4),
        group_size=4,
        groups_per_step=4,
        seed=0,
        **data_kwargs,
    )
    trainer.fit(policy, data)
    return grads.grads, record.steps


@pytest.mark.slow
def test_a_fit_with_dynamic_sampling_gives_the_same_gradient_in_streaming_and_sync():
    streaming, steps = _fit("streaming", dynamic_sampling=True, max_extra_groups=4)
    sync, sync_steps = _fit("sync", dynamic_sampling=True, max_extra_groups=4)
    assert len(streaming) == len(sync) == 2
    for a, b, s, t in zip(streaming, sync, steps, sync_steps):
        assert float(b.norm()) > 0 and float((a - b).norm() / b.norm()) <= 1e-5
        assert (s.groups_generated, s.groups_filtered, s.groups_folded) == (
            t.groups_generated,
            t.groups_filtered,
            t.groups_folded,
        )
        assert s.groups_folded == s.groups_generated - s.groups_filtered <= 4
        assert (
            s.groups_folded == 4 or s.groups_generated == 8
        )  # enough informative groups, or the budget spent
    assert (
        sum(s.groups_filtered for s in steps) > 0
    )  # the untrained toy policy really has uninformative groups
    _, async_steps = _fit("async", steps=2, dynamic_sampling=True, max_extra_groups=4)
    assert all(s.groups_folded == s.groups_generated - s.groups_filtered for s in async_steps)


def test_dynamic_sampling_options_are_checked():
    from thundersync_lightning.core import ConfigError
    from thundersync_lightning.envs.toy import GuessingGameTasks
    from thundersync_lightning.modules import RolloutDataModule
    from thundersync_lightning.rollout import EmbeddedEngineConfig

    def data(**kw):
        return RolloutDataModule(
            tasks=GuessingGameTasks(), engine=EmbeddedEngineConfig(), groups_per_step=3, **kw
        )

    assert data(dynamic_sampling=True).max_extra_groups == 3
    assert data(dynamic_sampling=True, max_extra_groups=7).max_extra_groups == 7
    assert data().max_extra_groups == 0
    with pytest.raises(ConfigError, match="max_extra_groups is only used with dynamic_sampling=True"):
        data(max_extra_groups=2)
    with pytest.raises(ConfigError, match="max_extra_groups must be >= 1 with dynamic_sampling"):
        data(dynamic_sampling=True, max_extra_groups=0)


def test_the_plan_splits_base_and_reserve_groups_by_rank():
    from thundersync_lightning.core.batches import RolloutBatch
    from thundersync_lightning.envs.toy import GuessingGameTasks

    plan = RolloutBatch(GuessingGameTasks(), None, 2, 4, 0, max_extra_groups=3)  # type: ignore[arg-type]
    base = RolloutBatch(GuessingGameTasks(), None, 2, 4, 0)  # type: ignore[arg-type]
    assert plan.request(5) == base.request(5)  # the step's own groups do not change
    assert [g.group_index for g in plan.reserve(5)] == [4, 5, 6] and base.reserve(5) == ()
    assert [g.group_index for g in plan.reserve(5, rank=1, world_size=2)] == [5]
    assert [g.group_index for g in plan.request(5, rank=1, world_size=2).groups] == [1, 3]
