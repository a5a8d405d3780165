"""Dynamic sampling (DAPO): a group whose kept rewards are all equal carries no GRPO signal.

DAPO (Yu et al., 2025, eq. 11) keeps sampling until the batch holds enough groups with
0 < #correct < G, i.e. rewards that are not all equal; verl's ``algorithm.filter_groups``
(``metric``: the score, ``max_num_gen_batches``: the extra budget) keeps a group when the std of
its scores is > 0, or when it has a single member. This module holds the one test every layer uses:
the accumulator (a filtered group counts nowhere), and the runner (a filtered group is replaced).

A group of one has std 0: under verl's rule it is kept, under DAPO's (std > 0) it carries no
signal. Here it is kept only where the objective gives a singleton an advantage
(``singleton="reward"``), so the filter never removes a group that would have trained.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["informative"]


def informative(rewards: Sequence[float], singleton_trains: bool) -> bool:
    """True when a group with these kept rewards trains: two distinct values, or one member whose
    advantage is not zero (``singleton_trains``). No kept member (every rollout failed and dropped):
    False."""
    if len(rewards) == 1:
        return singleton_trains
    return len(set(float(r) for r in rewards)) > 1
