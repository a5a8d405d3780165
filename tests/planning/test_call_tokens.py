"""The plan's bound on a learner call's padded tokens holds for every call the strategy cuts and
every micro-batch cut the policy makes (``planning.call_tokens`` against ``strategy.batching.call_size``
and ``modules.micro_batches``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from thundersync_lightning.modules.micro_batches import micro_batches
from thundersync_lightning.planning.call_tokens import call_padded_tokens
from thundersync_lightning.strategy.batching import call_size


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=40),
    rows=st.integers(1, 40),
    cap=st.one_of(st.none(), st.integers(1, 2000)),
    padding=st.sampled_from([0.0, 0.1, 0.25, 1.0]),
    forward=st.sampled_from([0, 8, 64, 500]),
    budget=st.sampled_from([64, 1024, 8192]),
)
def test_every_cut_call_pads_within_the_planned_bound(lengths, rows, cap, padding, forward, budget):
    longest = max(lengths)  # T: the plan's longest trajectory
    bound, _ = call_padded_tokens(rows, longest, cap, padding, forward)
    k = 0
    while k < len(lengths):
        n = call_size(lengths[k:], rows, cap)
        call = lengths[k : k + n]
        assert 1 <= n <= rows
        assert cap is None or n == 1 or sum(call) <= cap
        padded = sum(len(c) * max(call[i] for i in c) for c in micro_batches(call, budget, padding, forward))
        assert padded <= bound, (call, padded, bound)
        k += n
