"""The trace-replay engine follows its schedule and the engine protocol."""

from __future__ import annotations

import json

import pytest

from thundersync_lightning.core.errors import ConfigError, EngineError
from thundersync_lightning.envs.toy import GuessingGameTasks
from thundersync_lightning.rollout import (
    ContentReady,
    RolloutEngine,
    TraceReplayEngine,
    TraceReplayEngineConfig,
    load_trace,
    make_request,
    sync_idle_fraction,
)

from .helpers import collect

TASKS = GuessingGameTasks(latency="none")
FAST = 1e-5  # seconds per trace unit: a whole request replays in milliseconds


def make_engine(**kwargs) -> TraceReplayEngine:
    return TraceReplayEngineConfig(time_scale_s=FAST, **kwargs).build(TASKS.model_spec())


def test_events_follow_the_trace_schedule_and_carry_the_published_version():
    engine = make_engine()
    assert isinstance(engine, RolloutEngine)
    engine.publish({}, version=3)
    request = make_request(TASKS, step=0, num_groups=4, group_size=8, seed=0)
    trajs, rewards, order = collect(engine.rollout(request))
    assert len(trajs) == len(rewards) == 32 and len(order) == 64
    times = [e.time for e in order]
    assert times == sorted(times)
    rows = load_trace("paper_tail")
    for tid, traj in trajs.items():
        assert traj.policy_version == 3
        assert traj.content_ready_at <= rewards[tid].time
        assert traj.num_scored_tokens in {r.scored_tokens for r in rows}
        assert all(0 <= t < 16 for t in traj.tokens)
    prompts = {t.group_id: t.prompt for t in trajs.values()}
    assert all(t.prompt == prompts[t.group_id] for t in trajs.values())  # a group shares its prompt


def test_the_same_request_replays_the_same_tokens_and_rewards_whatever_the_split():
    engine = make_engine(source="lognormal")
    engine.publish({}, version=0)

    def run(groups):
        trajs, rewards, _ = collect(
            engine.rollout(make_request(TASKS, 1, 4, 4, seed=9, group_indices=groups))
        )
        return {k: t.tokens for k, t in trajs.items()}, {k: r.reward for k, r in rewards.items()}

    whole, a, b = run([0, 1, 2, 3]), run([0, 1]), run([3, 2])
    assert whole == ({**a[0], **b[0]}, {**a[1], **b[1]})


def test_requests_generate_one_after_another_and_a_later_publish_does_not_retag_an_earlier_request():
    engine = make_engine(source="pareto")
    engine.publish({}, version=0)
    first = engine.rollout(make_request(TASKS, 0, 2, 4, seed=0))
    engine.publish({}, version=1)
    second = engine.rollout(make_request(TASKS, 1, 2, 4, seed=0))
    t1, _, _ = collect(first)
    t2, _, _ = collect(second)
    assert {t.policy_version for t in t1.values()} == {0}
    assert {t.policy_version for t in t2.values()} == {1}
    assert min(t.content_ready_at for t in t2.values()) >= max(t.content_ready_at for t in t1.values())


def test_the_paper_tail_trace_makes_a_synchronous_learner_idle_about_half_the_step():
    assert sync_idle_fraction(TraceReplayEngineConfig()) == pytest.approx(0.495, abs=0.005)


def test_protocol_misuse_raises_engine_error():
    engine = make_engine()
    with pytest.raises(EngineError, match="publish"):
        engine.rollout(make_request(TASKS, 0, 1, 1, seed=0))
    engine.publish({}, version=1)
    with pytest.raises(EngineError, match="increase"):
        engine.publish({}, version=1)
    engine.shutdown()
    engine.shutdown()
    with pytest.raises(EngineError, match="shut down"):
        engine.rollout(make_request(TASKS, 0, 1, 1, seed=0))


def test_a_malformed_trace_file_is_rejected_with_the_expected_format(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"rows": [{"content_ready": 2.0, "reward_ready": 1.0, "scored_tokens": 3}]}))
    with pytest.raises(ConfigError, match="content_ready <= reward_ready"):
        load_trace(str(path))
    path.write_text(json.dumps({"rows": [{"content": 1}]}))
    with pytest.raises(ConfigError, match="expected"):
        load_trace(str(path))
    with pytest.raises(ConfigError, match="no shipped trace"):
        load_trace("no_such_trace")


def test_custom_traces_load_from_a_path(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"rows": [{"content_ready": 1.0, "reward_ready": 3.0, "scored_tokens": 5}]}))
    engine = make_engine(trace=str(path))
    engine.publish({}, version=0)
    trajs, _, order = collect(engine.rollout(make_request(TASKS, 0, 1, 2, seed=0)))
    assert {t.num_scored_tokens for t in trajs.values()} == {5}
    assert isinstance(order[0], ContentReady)


def test_rollout_slots_make_a_second_request_wait_for_the_first_requests_verdicts():
    # 4 slots, 4 trajectories per request: every trajectory of the second request starts in a slot
    # freed by a verdict of the first, so the k-th content of the second follows the k-th verdict.
    engine = make_engine(source="lognormal", rollout_slots=4)
    engine.publish({}, version=0)
    first = list(engine.rollout(make_request(TASKS, 0, 2, 2, seed=0)))
    second = list(engine.rollout(make_request(TASKS, 1, 2, 2, seed=0)))
    verdicts = sorted(e.time for e in first if not isinstance(e, ContentReady))
    contents = sorted(e.time for e in second if isinstance(e, ContentReady))
    assert len(contents) == 4
    assert all(c > v for c, v in zip(contents, verdicts))


def test_a_rollout_slot_count_below_one_is_rejected():
    with pytest.raises(ConfigError, match="rollout_slots"):
        TraceReplayEngineConfig(rollout_slots=0)


class _Clock:
    """A settable monotonic clock (the engine lays its schedule on it; sleeps stay sub-millisecond)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _engine_on(clock: _Clock, **kwargs) -> TraceReplayEngine:
    engine = TraceReplayEngine(
        TASKS.model_spec(), TraceReplayEngineConfig(time_scale_s=FAST, **kwargs), clock=clock
    )
    engine.publish({}, version=0)
    return engine


def test_environment_set_up_delays_generation_unless_the_request_was_prepared_ahead():
    # setup_fraction 0.5: an unprepared trajectory generates from t + 0.5 c, so its content lands at
    # t + 1.5 c; prepared long before (its set-up done), generation starts at t: content at t + c.
    request = make_request(TASKS, step=0, num_groups=2, group_size=4, seed=3)
    clock = _Clock()
    prepared = _engine_on(clock, setup_fraction=0.5)
    prepared.prepare(request)
    clock.now = 1e3
    ahead, ahead_rewards, _ = collect(prepared.rollout(request))
    late, late_rewards, _ = collect(_engine_on(clock, setup_fraction=0.5).rollout(request))
    plain, _, _ = collect(_engine_on(clock).rollout(request))
    for tid, t in plain.items():
        c = t.content_ready_at - 1e3
        assert ahead[tid].content_ready_at - 1e3 == pytest.approx(c, rel=1e-9)
        assert late[tid].content_ready_at - 1e3 == pytest.approx(1.5 * c, rel=1e-9)
        assert ahead[tid].tokens == late[tid].tokens == t.tokens  # only the times differ
        assert ahead_rewards[tid].reward == late_rewards[tid].reward


def test_a_request_prepared_just_before_its_rollout_still_waits_for_its_set_up():
    request = make_request(TASKS, step=0, num_groups=1, group_size=4, seed=3)
    clock = _Clock()
    engine = _engine_on(clock, setup_fraction=0.5)
    engine.prepare(request)
    just, _, _ = collect(engine.rollout(request))
    unprepared, _, _ = collect(_engine_on(clock, setup_fraction=0.5).rollout(request))
    assert {k: t.content_ready_at for k, t in just.items()} == {
        k: t.content_ready_at for k, t in unprepared.items()
    }


def test_token_scale_multiplies_every_trajectorys_scored_tokens():
    request = make_request(TASKS, step=0, num_groups=2, group_size=4, seed=1)
    clock = _Clock()
    plain, _, _ = collect(_engine_on(clock).rollout(request))
    longer, _, _ = collect(_engine_on(clock, token_scale=4.0).rollout(request))
    assert {k: 4 * t.num_scored_tokens for k, t in plain.items()} == {
        k: t.num_scored_tokens for k, t in longer.items()
    }


def test_a_non_positive_token_scale_and_a_negative_setup_fraction_are_both_reported():
    with pytest.raises(ConfigError) as err:
        TraceReplayEngineConfig(token_scale=0, setup_fraction=-0.1)
    assert "token_scale=0" in str(err.value) and "setup_fraction=-0.1" in str(err.value)
