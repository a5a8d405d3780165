"""CallCost: the least-squares line through learner calls' seconds, and the rows a call waits for."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thundersync_lightning.strategy.call_cost import CallCost


@given(
    a=st.floats(0.0, 0.05),
    b=st.floats(1e-4, 0.05),
    sizes=st.lists(st.integers(1, 64), min_size=2, max_size=40),
)
def test_calls_on_an_exact_line_give_its_fixed_and_per_row_seconds_and_k_is_the_ceiling_of_their_ratio(
    a, b, sizes
):
    cost = CallCost()
    cost.observe((n, a + b * n) for n in sizes)
    if len(set(sizes)) < 2:
        assert cost.line() is None and cost.min_rows(32) == 1
        return
    fit_a, fit_b = cost.line()
    assert fit_a == pytest.approx(a, abs=1e-9) and fit_b == pytest.approx(b, rel=1e-6)
    expected = max(1, min(32, math.ceil(a / b)))
    assert abs(cost.min_rows(32) - expected) <= 1  # the ceiling of a ratio recovered to 1e-6
    assert 1 <= cost.min_rows(32) <= 32


def test_compute_bound_calls_start_at_once_and_overhead_bound_ones_wait_for_rows():
    compute = CallCost()
    compute.observe([(1, 0.101), (4, 0.401), (16, 1.601)])  # a = 1 ms, b = 100 ms
    assert compute.min_rows(32) == 1
    overhead = CallCost()
    overhead.observe([(1, 0.011), (2, 0.012), (8, 0.018), (32, 0.042)])  # a = 10 ms, b = 1 ms
    assert overhead.min_rows(32) == 10
    assert overhead.min_rows(4) == 4  # never more than a call may hold


def test_the_window_forgets_old_calls_and_a_falling_or_unknown_line_waits_for_nothing():
    cost = CallCost(window=3)
    assert cost.line() is None and cost.min_rows(32) == 1
    cost.observe([(1, 0.5), (2, 0.4)])  # seconds fall with rows: nothing to trade
    assert cost.line() is None and cost.min_rows(32) == 1
    cost.observe([(1, 0.011), (2, 0.012), (4, 0.014)])  # the first two fall out of the window
    a, b = cost.line()
    assert a == pytest.approx(0.010) and b == pytest.approx(0.001)
    cost.observe([(0, 1.0), (3, -1.0)])  # no rows, negative seconds: not calls
    assert cost.line() == pytest.approx((0.010, 0.001))
