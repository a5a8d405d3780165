"""The most padded tokens one learner call holds in its forwards' graphs (the activation plan's n T).

A call scores ``r`` trajectories of at most ``T`` tokens each and keeps every forward's graph
until its one backward, so its activations are its *padded* tokens times the bytes per token.
Rows padded to at most ``T`` give the plain bound ``r T``. A token cap ``B``
(``max_batch_tokens``) bounds the call's real tokens by ``max(B, T)`` (a trajectory longer than
``B`` goes alone); the policy's micro-batches (``GRPOPolicy(score_max_padding=p,
score_forward_tokens=F)``, :mod:`~thundersync_lightning.modules.micro_batches`) pad each
micro-batch c to at most ``max((1 + p) real_c, real_c + F) <= (1 + p) real_c + F``, and a
micro-batch of one row is not padded at all, so only micro-batches of two rows or more (at most
``floor(r / 2)`` of them) add F:

    padded  <=  min(r T,  (1 + p) max(B, T) + F floor(r / 2))

Without the scorer's padding rule (``p`` unknown) only ``r T`` holds, whatever ``B``.
"""

from __future__ import annotations

import math

__all__ = ["call_padded_tokens"]


def call_padded_tokens(
    rows: int,
    max_tokens_per_trajectory: int,
    max_batch_tokens: int | None = None,
    max_padding: float | None = None,
    forward_tokens: int = 0,
) -> tuple[int, str]:
    """The bound of the module docstring and how it was reached (for the plan's note)."""
    plain = rows * max_tokens_per_trajectory
    plain_note = f"{rows} trajectories x {max_tokens_per_trajectory} tokens"
    if max_batch_tokens is None:
        return plain, plain_note
    if max_padding is None or math.isinf(max_padding):
        return plain, plain_note + f" (max_batch_tokens={max_batch_tokens} bounds real tokens; the scorer's padding is unknown)"
    real = max(max_batch_tokens, max_tokens_per_trajectory)
    shared = rows // 2  # micro-batches of >= 2 rows: the only ones padded
    capped = math.ceil((1.0 + max_padding) * real) + forward_tokens * shared
    if capped >= plain:
        return plain, plain_note
    return capped, (
        f"max_batch_tokens={max_batch_tokens}: {real} tokens x (1 + {max_padding:g} padding) "
        f"+ {forward_tokens} x {shared} shared forwards"
    )
