"""The engine-agnostic agent loop, in process, with a scripted and with a real generator."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import torch

from thundersync_lightning.envs.toy import GuessingGameTasks
from thundersync_lightning.rollout import (
    AgentLoop,
    EnvPool,
    Generation,
    GenerationRequest,
    HFGenerator,
    make_request,
)

from ..conftest import random_model
from ..helpers import assert_same_outcomes, collect, learner_logprobs
from ..procs import wait_until
from ..scripted import MODES, CountingTasks, ScriptedTasks, drain, take


@pytest.fixture
def pool():
    p = EnvPool(8)
    yield p
    p.shutdown()


def always(token: int):
    """A generator that always answers ``token`` (logprob 0)."""

    def generate(requests: Sequence[GenerationRequest]) -> list[Generation]:
        return [Generation((token,) * r.max_new_tokens, (0.0,) * r.max_new_tokens) for r in requests]

    return generate


def test_an_episode_alternates_scored_actions_and_unscored_observations_until_the_turn_limit(pool):
    tasks = GuessingGameTasks(latency="none", max_turns=3)
    request = make_request(tasks, step=0, num_groups=1, group_size=1, seed=0)
    secret = request.groups[0].task.secret
    wrong = (secret + 1) % tasks.num_digits
    events: list = []
    assert AgentLoop(tasks, always(wrong), pool).run(request, 4, events.append).wait(timeout=30)
    trajs, rewards, _ = collect(events)
    traj = trajs["s0-g0-t0"]
    assert traj.finish_reason == "turn_limit" and traj.num_turns == 3 and traj.policy_version == 4
    assert [s.scored for s in traj.segments] == [True, False] * 3
    assert [s.tokens for s in traj.segments if s.scored] == [(wrong,)] * 3
    assert rewards["s0-g0-t0"].reward == 0.0


def test_an_episode_ends_with_submit_when_the_environment_says_done(pool):
    tasks = GuessingGameTasks(latency="none")
    request = make_request(tasks, step=0, num_groups=1, group_size=2, seed=0)
    events: list = []
    assert (
        AgentLoop(tasks, always(request.groups[0].task.secret), pool).run(request, 0, events.append).wait(30)
    )
    trajs, rewards, _ = collect(events)
    assert {t.finish_reason for t in trajs.values()} == {"submit"}
    assert {t.num_turns for t in trajs.values()} == {1}
    assert {r.reward for r in rewards.values()} == {1.0}


def test_a_context_budget_ends_the_episode_with_length(pool):
    tasks = GuessingGameTasks(latency="none", max_turns=10)
    request = make_request(tasks, step=0, num_groups=1, group_size=1, seed=0)
    wrong = (request.groups[0].task.secret + 1) % tasks.num_digits
    events: list = []
    AgentLoop(tasks, always(wrong), pool, max_context_tokens=5).run(request, 0, events.append)
    traj = next(e for e in events if hasattr(e, "trajectory")).trajectory
    assert traj.finish_reason == "length" and len(traj.tokens) <= 5


def test_tokens_do_not_depend_on_batch_size_or_group_order_and_logprobs_match_at_another_temperature(spec):
    model = random_model(spec, 6)
    tasks = ScriptedTasks(modes=("ok",))
    temperature = 0.7
    results = []
    for max_batch, groups in ((None, [0, 1, 2, 3]), (3, [3, 1, 2, 0])):
        pool = EnvPool(4)
        generate = HFGenerator(model, temperature=temperature, top_p=0.9)
        loop = AgentLoop(tasks, generate, pool, max_batch_size=max_batch)
        request = make_request(tasks, step=5, num_groups=4, group_size=6, seed=2, group_indices=groups)
        events: list = []
        assert loop.run(request, 0, events.append).wait(timeout=30)
        pool.shutdown()
        trajs, rewards, _ = collect(events)
        results.append(({k: t.tokens for k, t in trajs.items()}, {k: r.reward for k, r in rewards.items()}))
        for t in trajs.values():
            # the engine reports the distribution it sampled from: the top-p truncated, renormalised one
            reported = torch.tensor(t.sampling_logprobs)
            assert (learner_logprobs(model, t, temperature, top_p=0.9) - reported).abs().max() <= 1e-4
            assert bool((reported >= learner_logprobs(model, t, temperature) - 1e-6).all())
    assert results[0] == results[1]


def test_failed_resets_still_yield_both_events(pool):
    tasks = ScriptedTasks(modes=(MODES[-1],))  # reset_raises
    request = make_request(tasks, step=0, num_groups=1, group_size=3, seed=0)
    events: list = []
    assert AgentLoop(tasks, always(0), pool).run(request, 0, events.append).wait(timeout=30)
    trajs, rewards, _ = collect(events)
    assert len(trajs) == 3 and len(rewards) == 3
    assert all(t.finish_reason == "failure" and t.num_scored_tokens == 0 for t in trajs.values())
    assert all(r.reward == 0.0 and "reset raised" in r.failure for r in rewards.values())


class _ClosingTasks(ScriptedTasks):
    """ScriptedTasks whose environments record their ``close`` (in process only)."""

    def make_env(self, task, seed):
        env = super().make_env(task, seed)
        env.close = lambda: CLOSED.append(seed)
        return env


CLOSED: list[int] = []


def test_when_generation_raises_every_unfinished_environment_is_closed():
    CLOSED.clear()
    tasks = _ClosingTasks()
    request = make_request(tasks, step=0, num_groups=2, group_size=3, seed=0)
    calls = []

    def fails_on_second_turn(requests):
        calls.append(len(requests))
        if len(calls) == 2:
            raise RuntimeError("generation process gone")
        return always(0)(requests)  # guess 0: episodes continue (or a few find the secret)

    pool = EnvPool(4)
    try:
        with pytest.raises(RuntimeError, match="generation process gone"):
            AgentLoop(tasks, fails_on_second_turn, pool).run(request, 0, lambda event: None)
        # finished episodes close after their verdict, unfinished ones by the clean-up
        assert wait_until(lambda: len(CLOSED) == 6, 10.0), f"closed {len(CLOSED)} of 6 environments"
        assert len(set(CLOSED)) == 6
    finally:
        pool.shutdown()


def seeded(requests: Sequence[GenerationRequest]) -> list[Generation]:
    """A generator whose guess depends on the turn's seed and the prefix (logprob 0)."""
    return [Generation(((r.seed + len(r.prefix)) % 10,), (0.0,)) for r in requests]


def _counting() -> CountingTasks:
    # groups: ok, reset_raises (the failure must surface at rollout), step_raises
    return CountingTasks(
        modes=("ok", "reset_raises", "step_raises"),
        made=threading.Semaphore(0),
        closed=threading.Semaphore(0),
    )


def test_a_prepared_request_gives_the_same_events_as_an_unprepared_one_and_creates_its_environments_once(
    pool,
):
    tasks = _counting()
    request = make_request(tasks, step=2, num_groups=3, group_size=4, seed=9)
    unprepared: list = []
    assert AgentLoop(tasks, seeded, pool).run(request, 0, unprepared.append).wait(timeout=30)
    assert drain(tasks.made) == 8  # the reset_raises group creates nothing

    loop = AgentLoop(tasks, seeded, pool)
    loop.prepare(request)
    assert take(tasks.made, 8) == 8  # created by prepare: nothing else ran yet
    prepared: list = []
    assert loop.run(request, 0, prepared.append).wait(timeout=30)
    assert drain(tasks.made) == 0  # the rollout created none again

    assert_same_outcomes(prepared, unprepared)
    failures = [r.failure for r in collect(prepared)[1].values() if r.failure]
    assert len(failures) == 8 and all(f.startswith(("reset raised", "step raised")) for f in failures)


def test_prepared_environments_no_rollout_claims_are_closed_and_later_prepares_do_nothing(pool):
    tasks = _counting()
    loop = AgentLoop(tasks, seeded, pool)
    loop.prepare(make_request(tasks, step=0, num_groups=1, group_size=3, seed=0))
    assert take(tasks.made, 3) == 3
    assert loop.close_prepared() == 3
    assert drain(tasks.closed) == 3
    loop.prepare(make_request(tasks, step=1, num_groups=1, group_size=3, seed=0))
    assert loop.close_prepared() == 0 and drain(tasks.made) == 0


def test_running_a_later_step_closes_the_prepared_environments_of_an_earlier_one(pool):
    tasks = _counting()
    loop = AgentLoop(tasks, seeded, pool)
    loop.prepare(make_request(tasks, step=0, num_groups=1, group_size=3, seed=0))
    assert take(tasks.made, 3) == 3
    events: list = []
    assert loop.run(make_request(tasks, step=1, num_groups=1, group_size=2, seed=0), 0, events.append).wait(
        30
    )
    assert take(tasks.closed, 3 + 2) == 5  # step 0's three, then step 1's two after their verdicts
    assert loop.close_prepared() == 0
