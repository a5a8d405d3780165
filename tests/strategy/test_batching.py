"""The learner's batching rule (``strategy.batching.next_batch``): which waiting trajectories go next."""

from __future__ import annotations

from thundersync_lightning.strategy.batching import Batch, count_destinations, next_batch

MEMBERS = {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"], "c": ["c0", "c1", "c2"]}
OWNER = {t: g for g, ts in MEMBERS.items() for t in ts}


def choose(waiting, rewards, max_batch=32, hold=9):
    """One destination per call (the plain backward backend); ``hold``: reward-pending rows allowed."""
    return next_batch(waiting, rewards, OWNER, MEMBERS, max_batch, hold=hold)


def test_fully_rewarded_groups_go_first_and_together_across_groups():
    rewards = {t: 1.0 for t in MEMBERS["a"] + MEMBERS["c"]} | {"b0": 0.0, "b1": 0.0}
    waiting = ["b0", "a0", "b1", "c2", "a2"]
    assert choose(waiting, rewards) == Batch("direct", ["a0", "c2", "a2"])  # b still waits for b2's verdict


def test_without_complete_groups_the_largest_group_and_reward_bucket_goes_next():
    rewards = {"a0": 1.0, "a1": 0.0, "b0": 0.0, "b1": 0.0}
    assert choose(["a0", "a1", "b0", "b1"], rewards) == Batch("bucket", ["b0", "b1"])


def test_a_reward_pending_trajectory_goes_alone_oldest_first_and_only_when_one_more_may_be_held():
    waiting = ["c1", "a0", "b2"]
    assert choose(waiting, {}) == Batch("held", ["c1"])
    assert choose(waiting, {}, hold=0) is None  # an event is queued, or the held bound is reached
    assert choose(waiting, {}, hold=1) == Batch("held", ["c1"])


def test_known_reward_work_is_preferred_to_a_pending_trajectory_even_when_younger():
    assert choose(["a0", "b0"], {"b0": 1.0}) == Batch("bucket", ["b0"])


def test_a_batch_is_cut_at_max_batch_trajectories():
    rewards = {t: 1.0 for ts in MEMBERS.values() for t in ts}
    waiting = [t for ts in MEMBERS.values() for t in ts]
    assert choose(waiting, rewards, max_batch=4) == Batch("direct", waiting[:4])


def test_nothing_waiting_means_nothing_to_do():
    assert choose([], {"a0": 1.0}) is None


def mixed(waiting, rewards, max_batch=32, hold=9, destinations=99):
    """A backend that serves several destinations in one backward (e.g. the split backward)."""
    return next_batch(waiting, rewards, OWNER, MEMBERS, max_batch, hold=hold, destinations=destinations)


def test_a_call_spanning_destinations_takes_direct_rows_then_buckets_largest_first_then_pending_oldest_first():  # noqa: E501
    rewards = {t: 1.0 for t in MEMBERS["a"]} | {"b0": 0.0, "c0": 1.0, "c1": 1.0}
    waiting = ["c1", "b0", "a0", "b1", "c0", "b2"]
    batch = mixed(waiting, rewards)
    assert batch == Batch("direct", ["a0", "c1", "c0", "b0", "b1", "b2"])
    assert (
        count_destinations(batch.trajectories, rewards, OWNER, MEMBERS) == 5
    )  # step, (c, 1), (b, 0), b1, b2
    assert mixed(waiting, rewards, hold=0) == Batch("direct", ["a0", "c1", "c0", "b0"])
    assert mixed(waiting, rewards, hold=1) == Batch("direct", ["a0", "c1", "c0", "b0", "b1"])
    assert mixed(waiting, rewards, max_batch=3) == Batch("direct", ["a0", "c1", "c0"])
    assert mixed(waiting, rewards, destinations=2) == Batch("direct", ["a0", "c1", "c0"])  # step, (c, 1)
    assert mixed(["c1", "a0"], {}, destinations=1) == Batch("held", ["c1"])


def test_a_call_spanning_destinations_names_its_first_rule_and_holds_nothing_without_room():
    assert mixed(["c1", "b0"], {"b0": 1.0}) == Batch("bucket", ["b0", "c1"])
    assert mixed(["c1", "a0"], {}) == Batch("held", ["c1", "a0"])
    assert mixed(["c1", "a0"], {}, hold=0) is None
    assert count_destinations(["a0", "a1"], {"a0": 1.0, "a1": 1.0, "a2": 0.0}, OWNER, MEMBERS) == 1


LENGTHS = {"a0": 5, "a1": 7, "a2": 3, "b0": 20, "b1": 2, "b2": 2, "c0": 4, "c1": 4, "c2": 4}


def capped(waiting, rewards, max_tokens, destinations=1, max_batch=32):
    return next_batch(
        waiting, rewards, OWNER, MEMBERS, max_batch,
        hold=9, destinations=destinations, lengths=LENGTHS, max_tokens=max_tokens,
    )  # fmt: skip


def test_a_token_cap_takes_the_longest_prefix_within_it_on_every_path():
    every = {t: 1.0 for ts in MEMBERS.values() for t in ts}
    waiting = ["a0", "a1", "a2", "c0", "c1"]
    assert capped(waiting, every, 12) == Batch("direct", ["a0", "a1"])  # 5 + 7 = 12: at the cap
    assert capped(waiting, every, 11) == Batch("direct", ["a0"])
    assert capped(waiting, every, 10_000) == Batch("direct", waiting)
    assert capped(waiting, every, 10_000, max_batch=2) == Batch("direct", ["a0", "a1"])  # both caps hold
    bucket = {"c0": 1.0, "c1": 1.0, "c2": 1.0, "a0": 0.0}
    partial = {"c0": 1.0, "c1": 1.0}
    assert capped(["c0", "c1", "a0"], partial, 8) == Batch("bucket", ["c0", "c1"])
    assert capped(["c0", "c1", "a0"], partial, 7) == Batch("bucket", ["c0"])
    assert capped(["c0", "c1", "a0"], bucket, 9, destinations=99) == Batch(
        "direct", ["c0", "c1"]
    )  # then a0 (5)
    assert capped(["b1", "b2", "a0"], {}, 9, destinations=99) == Batch("held", ["b1", "b2", "a0"])


def test_a_trajectory_longer_than_the_token_cap_goes_alone_and_does_not_block():
    every = {t: 1.0 for ts in MEMBERS.values() for t in ts}
    assert capped(["b0", "b1"], every, 8) == Batch("direct", ["b0"])  # 20 tokens > 8: alone
    assert capped(["b1", "b0"], every, 8) == Batch("direct", ["b1"])  # the long one waits for its own call
    assert capped(["b0"], {}, 8) == Batch("held", ["b0"])


def test_without_a_token_cap_lengths_are_not_needed():
    every = {t: 1.0 for ts in MEMBERS.values() for t in ts}
    assert next_batch(["a0", "b0"], every, OWNER, MEMBERS, 32, hold=9, max_tokens=None) == Batch(
        "direct", ["a0", "b0"]
    )
