"""Which tasks a step trains on, and which are held out: the two rules every task family shares.

- :func:`pick`: a step's ``num_groups`` tasks are a permutation of the training tasks seeded by
  ``derive_seed(seed, step, -1, -1)`` (never by arrival order, rank or engine), cycled when more
  groups are asked for than there are tasks.
- :func:`held_out`: a task is held out when ``blake2b(key) mod 10_000 < round(val_fraction *
  10_000)``: the hash of its key alone decides, so the split does not move when tasks are added,
  removed or reordered, and each family says what its key is (a task's name, id or row index).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import TypeVar

from ..core.types import derive_seed

__all__ = ["pick", "held_out", "SPLIT_BUCKETS"]

T = TypeVar("T")

#: held_out's resolution: val_fraction is rounded to a multiple of 1 / SPLIT_BUCKETS
SPLIT_BUCKETS = 10_000


def pick(items: Sequence[T], step: int, num_groups: int, seed: int) -> list[T]:
    """``num_groups`` items for ``step``: a seeded permutation, cycled when more are asked than exist."""
    rng = random.Random(derive_seed(seed, step, -1, -1))
    out: list[T] = []
    while len(out) < num_groups:
        order = list(range(len(items)))
        rng.shuffle(order)
        out.extend(items[i] for i in order[: num_groups - len(out)])
    return out


def held_out(key: str, val_fraction: float) -> bool:
    """Whether the task whose key is ``key`` is held out at ``val_fraction`` (the module's rule)."""
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") % SPLIT_BUCKETS
    return h < round(val_fraction * SPLIT_BUCKETS)
