"""How a scoring call splits its trajectories into right-padded forwards (micro-batches).

A forward over rows padded to their longest costs ``rows x longest`` tokens of compute, whatever
the rows' own lengths, so the learner's work per real token is ``padded / real``; each forward
also has a fixed cost (kernel launches, the model's Python), worth ``overhead_tokens`` padded
tokens. Sorting by length and cutting greedily keeps every micro-batch under the activation
budget and its padding within ``max_padding`` of its real tokens, or within one forward's fixed
cost where that is more (cutting there would cost more than the padding it saves):

    rows x longest  <=  budget_tokens
    rows x longest  <=  max((1 + max_padding) x sum(lengths),  sum(lengths) + overhead_tokens)

All micro-batches of one call still share ONE backward (the accumulator sums their terms), so a
tighter padding bound costs only extra forward launches, never extra backward passes. It matters
most where a batch mixes lengths (the streaming learner batches whatever has landed, across
groups); the synchronous learner's whole sorted batch is cut almost the same either way.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["micro_batches"]


def micro_batches(
    lengths: Sequence[int], budget_tokens: int, max_padding: float, overhead_tokens: int = 0
) -> list[list[int]]:
    """Indices into ``lengths`` grouped into micro-batches, each in ascending length order.

    Every index appears exactly once; a single row longer than the budget is its own micro-batch.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    chunks: list[list[int]] = []
    real = 0
    for i in order:  # ascending: the newcomer is the chunk's longest row
        n = lengths[i]
        padded = (len(chunks[-1]) + 1) * n if chunks else 0
        allowed = max((1.0 + max_padding) * (real + n), real + n + overhead_tokens)
        if chunks and padded <= budget_tokens and padded <= allowed:
            chunks[-1].append(i)
            real += n
        else:
            chunks.append([i])
            real = n
    return chunks
