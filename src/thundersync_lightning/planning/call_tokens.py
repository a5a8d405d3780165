"""The most padded tokens one learner call holds in its forwards' graphs (the activation plan's n T).

A call scores ``r`` trajectories of at most ``T`` tokens each and keeps every forward's graph
until its one backward, so its activations are its *padded* tokens times the bytes per token.
Rows padded to at most ``T`` give the plain bound ``r T``. Under a token cap ``B``
(``max_batch_tokens``) a call is either one trajectory (one longer than ``B`` goes alone), with no
padding at all, or several whose real tokens sum to at most ``B``. The policy's micro-batches
(``GRPOPolicy(score_max_padding=p, score_forward_tokens=F)``,
:mod:`~thundersync_lightning.modules.micro_batches`) pad each micro-batch c to at most
``max((1 + p) real_c, real_c + F) <= (1 + p) real_c + F``, and a micro-batch of one row is not
padded, so only those of two rows or more (at most ``floor(r / 2)``) add F:

    padded  <=  min(r T,  max(T,  (1 + p) B + F floor(r / 2)))

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
        return (
            plain,
            plain_note
            + f" (max_batch_tokens={max_batch_tokens} bounds real tokens; the scorer's padding is unknown)",
        )
    shared = rows // 2  # micro-batches of >= 2 rows: the only ones padded
    several = math.ceil((1.0 + max_padding) * max_batch_tokens) + forward_tokens * shared
    capped = max(max_tokens_per_trajectory, several)  # one trajectory alone: T, unpadded
    if capped >= plain:
        return plain, plain_note
    if several <= max_tokens_per_trajectory:
        return (
            capped,
            f"max_batch_tokens={max_batch_tokens}: at most one {max_tokens_per_trajectory}-token trajectory",
        )
    return capped, (
        f"max_batch_tokens={max_batch_tokens}: {max_batch_tokens} tokens x (1 + {max_padding:g} padding) "
        f"+ {forward_tokens} x {shared} shared forwards"
    )
