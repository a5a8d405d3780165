"""The correct functions that mutation tasks are made from, with the inputs their tests call.

Every function is small, pure and terminating for every mutation the generator makes (loops run
over ``range`` or a list, never ``while``), so a mutated body can only be wrong, never hang. The
expected outputs are not stored: they are computed from the correct source when tasks are built.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Seed", "SEEDS"]


@dataclass(frozen=True, slots=True)
class Seed:
    """A correct function ``name`` (its source) and the argument tuples its tests use."""

    name: str
    source: str
    inputs: tuple[tuple, ...]


SEEDS: tuple[Seed, ...] = (
    Seed(
        "clamp",
        "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n"
        "    return x\n",
        ((5, 0, 10), (-3, 0, 10), (12, 0, 10), (0, 0, 10), (10, 0, 10), (7, 2, 4)),
    ),
    Seed(
        "sum_to",
        "def sum_to(n):\n    total = 0\n    for i in range(1, n + 1):\n        total += i\n"
        "    return total\n",
        ((0,), (1,), (4,), (10,), (7,), (3,)),
    ),
    Seed(
        "count_even",
        "def count_even(xs):\n    n = 0\n    for x in xs:\n        if x % 2 == 0:\n            n += 1\n"
        "    return n\n",
        (([1, 2, 3, 4],), ([],), ([2, 2, 5],), ([1, 3],), ([0, 7, 8, 10],), ([6],)),
    ),
    Seed(
        "max_of",
        "def max_of(xs):\n    best = xs[0]\n    for x in xs[1:]:\n        if x > best:\n"
        "            best = x\n    return best\n",
        (([3, 1, 2],), ([1, 5, 4],), ([7],), ([-2, -5],), ([2, 9, 9, 1],), ([0, 3, 8],)),
    ),
    Seed(
        "min_of",
        "def min_of(xs):\n    best = xs[0]\n    for x in xs[1:]:\n        if x < best:\n"
        "            best = x\n    return best\n",
        (([3, 1, 2],), ([1, 5, 4],), ([7],), ([-2, -5],), ([2, 9, 0, 1],), ([4, 3, 8],)),
    ),
    Seed(
        "factorial",
        "def factorial(n):\n    out = 1\n    for k in range(2, n + 1):\n        out *= k\n    return out\n",
        ((0,), (1,), (3,), (5,), (6,), (2,)),
    ),
    Seed(
        "is_sorted",
        "def is_sorted(xs):\n    for i in range(len(xs) - 1):\n        if xs[i] > xs[i + 1]:\n"
        "            return False\n    return True\n",
        (([1, 2, 3],), ([3, 1],), ([],), ([2, 2, 3],), ([1, 3, 2],), ([5],)),
    ),
    Seed(
        "abs_diff",
        "def abs_diff(a, b):\n    if a > b:\n        return a - b\n    return b - a\n",
        ((5, 3), (3, 5), (4, 4), (-2, 3), (10, 1), (0, 7)),
    ),
    Seed(
        "sign",
        "def sign(x):\n    if x > 0:\n        return 1\n    if x < 0:\n        return -1\n    return 0\n",
        ((5,), (-3,), (0,), (1,), (-1,), (42,)),
    ),
    Seed(
        "last_index",
        "def last_index(xs, v):\n    found = -1\n    for i in range(len(xs)):\n        if xs[i] == v:\n"
        "            found = i\n    return found\n",
        (([1, 2, 1], 1), ([1, 2, 3], 4), ([5], 5), ([], 1), ([2, 2, 2], 2), ([3, 4, 5], 3)),
    ),
    Seed(
        "dot",
        "def dot(a, b):\n    s = 0\n    for i in range(len(a)):\n        s += a[i] * b[i]\n    return s\n",
        (([1, 2], [3, 4]), ([], []), ([2], [5]), ([1, 0, 2], [3, 9, 1]), ([-1, 2], [2, 2]), ([3, 3], [1, 2])),
    ),
    Seed(
        "power",
        "def power(b, e):\n    out = 1\n    for _ in range(e):\n        out *= b\n    return out\n",
        ((2, 3), (3, 0), (5, 1), (2, 5), (1, 7), (4, 2)),
    ),
    Seed(
        "count_above",
        "def count_above(xs, t):\n    c = 0\n    for x in xs:\n        if x > t:\n            c += 1\n"
        "    return c\n",
        (([1, 5, 3], 2), ([], 0), ([4, 4], 4), ([9, 1, 7], 5), ([0, -1], -2), ([2, 3], 3)),
    ),
    Seed(
        "running_max",
        "def running_max(xs):\n    out = []\n    for i in range(len(xs)):\n"
        "        if i == 0 or xs[i] > out[-1]:\n            out.append(xs[i])\n        else:\n"
        "            out.append(out[-1])\n    return out\n",
        (([1, 3, 2],), ([],), ([5, 4, 6],), ([2, 2],), ([0, 9, 1, 10],), ([7],)),
    ),
    Seed(
        "middle",
        "def middle(a, b, c):\n    if a <= b <= c or c <= b <= a:\n        return b\n"
        "    if b <= a <= c or c <= a <= b:\n        return a\n    return c\n",
        ((1, 2, 3), (3, 1, 2), (2, 3, 1), (5, 5, 1), (0, 9, 4), (7, 3, 5)),
    ),
    Seed(
        "fib",
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
        ((0,), (1,), (2,), (5,), (7,), (10,)),
    ),
    Seed(
        "range_sum",
        "def range_sum(xs, lo, hi):\n    s = 0\n    for i in range(lo, hi):\n        s += xs[i]\n"
        "    return s\n",
        (
            ([1, 2, 3, 4], 1, 3),
            ([5, 6], 0, 2),
            ([1, 1, 1], 0, 0),
            ([4, 3, 2, 1], 2, 4),
            ([9, 8, 7], 0, 1),
            ([2, 4, 6, 8], 1, 4),
        ),
    ),
    Seed(
        "digits_sum",
        "def digits_sum(n):\n    s = 0\n    for ch in str(n):\n        s += int(ch)\n    return s\n",
        ((0,), (7,), (12,), (999,), (1050,), (38,)),
    ),
    Seed(
        "both_positive",
        "def both_positive(a, b):\n    return a > 0 and b > 0\n",
        ((1, 2), (0, 5), (3, -1), (-2, -2), (4, 4), (1, 0)),
    ),
    Seed(
        "mean_floor",
        "def mean_floor(xs):\n    return sum(xs) // len(xs)\n",
        (([1, 2, 3],), ([4],), ([1, 2],), ([10, 0, 5],), ([7, 8, 9, 10],), ([3, 3],)),
    ),
    Seed(
        "triangle",
        "def triangle(a, b, c):\n    return a + b > c and a + c > b and b + c > a\n",
        ((3, 4, 5), (1, 1, 3), (2, 2, 2), (1, 2, 3), (5, 1, 5), (10, 3, 4)),
    ),
    Seed(
        "step_count",
        "def step_count(n, k):\n    c = 0\n    for i in range(0, n, k):\n        c += 1\n    return c\n",
        ((10, 3), (9, 3), (1, 1), (0, 2), (7, 2), (12, 4)),
    ),
    Seed(
        "pairs_equal",
        "def pairs_equal(xs):\n    c = 0\n    for i in range(len(xs) - 1):\n        if xs[i] == xs[i + 1]:\n"
        "            c += 1\n    return c\n",
        (([1, 1, 2],), ([],), ([3, 3, 3],), ([1, 2, 1],), ([5, 5, 6, 6],), ([4],)),
    ),
    Seed(
        "rescale",
        "def rescale(x, a, b):\n    return (x - a) * 10 // (b - a)\n",
        ((5, 0, 10), (0, 0, 10), (10, 0, 10), (3, 1, 5), (7, 2, 12), (4, 4, 8)),
    ),
)
