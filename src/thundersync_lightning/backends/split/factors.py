"""A destination's gradient kept as factors until its coefficient is known.

The split backward (:mod:`~thundersync_lightning.backends.split.backward`) knows, for every row, the
activation gradient dY at each module's output and the module's input X. For ``nn.Linear``
(y = x W^T + b) a destination j's weight gradient is dY_j^T X_j over its rows' tokens. Formed at
once it costs an out x in write per destination per scored batch, which for short trajectories is
far more than the N_j (in + out) values of its factors. A :class:`Chunk` keeps those factors (for
``nn.Embedding``: the token ids and dY rows) and forms the gradient only when the group folds,
when every coefficient c_k = a_g r_k + b_g is known, in ONE matmul per parameter:

    sum_k c_k dY_k^T X_k = (concat_k c_k dY_k)^T (concat_k X_k)

A part is kept as factors only when they take fewer bytes than its dense gradient (so a chunk
never takes more bytes than the parameter-sized buffer it replaces); biases, norm scales and any
other parameter keep their (small) dense gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from ...core.gradients.deferred import DeferredGradient

__all__ = ["LinearFactors", "EmbeddingFactors", "TiedFactors", "Chunk", "chunk_of", "fold_chunks"]


@dataclass(frozen=True, slots=True)
class LinearFactors:
    """``grad W = dy^T x``: x (N, in), dy (N, out), one row per token."""

    x: Tensor
    dy: Tensor

    @property
    def nbytes(self) -> int:
        return _bytes(self.x) + _bytes(self.dy)


@dataclass(frozen=True, slots=True)
class EmbeddingFactors:
    """``grad W = zeros(num_embeddings, d).index_add(0, ids, rows)``: ids (N,), rows (N, d)."""

    ids: Tensor
    rows: Tensor

    @property
    def nbytes(self) -> int:
        return _bytes(self.ids) + _bytes(self.rows)


@dataclass(frozen=True, slots=True)
class TiedFactors:
    """One weight reached both as an Embedding and as a Linear (a tied input embedding and output
    head): its gradient is the sum of both kinds' gradients."""

    linear: LinearFactors
    embedding: EmbeddingFactors

    @property
    def nbytes(self) -> int:
        return self.linear.nbytes + self.embedding.nbytes


Factors = LinearFactors | EmbeddingFactors
Part = Tensor | Factors | TiedFactors


def _bytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass(frozen=True, slots=True)
class Chunk(DeferredGradient):
    """One destination's gradient from one scored batch: per parameter a dense tensor, factors,
    or None (no path). The split backend's deferred gradient."""

    parts: tuple[Part | None, ...]
    shapes: tuple[torch.Size, ...]
    nbytes: int  # of every part

    @staticmethod
    def of(parts: Sequence[Part | None], shapes: Sequence[torch.Size]) -> Chunk:
        nbytes = sum(_bytes(p) if isinstance(p, Tensor) else p.nbytes for p in parts if p is not None)
        return Chunk(tuple(parts), tuple(shapes), nbytes)

    def dense(self) -> list[Tensor | None]:
        """Every parameter's gradient formed (in float32 or wider; the accumulator casts)."""
        return [None if p is None else _form(p, s) for p, s in zip(self.parts, self.shapes)]

    @staticmethod
    def fold(views: Sequence[Tensor], items: Sequence[DeferredGradient], coefs: Sequence[float]) -> None:
        fold_chunks(views, items, coefs)  # type: ignore[arg-type]


def _wide(t: Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)


def _form(part: Part, shape: torch.Size) -> Tensor:
    if isinstance(part, Tensor):
        return part
    if isinstance(part, TiedFactors):
        return _form(part.linear, shape) + _form(part.embedding, shape)
    if isinstance(part, LinearFactors):
        wide = _wide(part.dy)
        return part.dy.to(wide).t() @ part.x.to(wide)
    wide = _wide(part.rows)
    return torch.zeros(shape, dtype=wide, device=part.rows.device).index_add_(0, part.ids, part.rows.to(wide))


def chunk_of(
    dense: Sequence[Tensor | None],
    pieces: dict[int, list[Factors]],
    params: Sequence[Tensor],
) -> Chunk:
    """A chunk from one destination's dense gradients and its factor pieces per parameter index
    (a token slice each); a part whose factors would take more bytes than its dense gradient is
    formed now. A weight reached both as a Linear and as an Embedding one keeps both kinds
    (:class:`TiedFactors`)."""
    parts: list[Part | None] = list(dense)
    for k, found in pieces.items():
        linear = _merge([p for p in found if isinstance(p, LinearFactors)])
        embedding = _merge([p for p in found if isinstance(p, EmbeddingFactors)])
        part: Part
        if linear is not None and embedding is not None:
            part, grad_like = TiedFactors(linear, embedding), linear.dy
        elif linear is not None:
            part, grad_like = linear, linear.dy
        else:  # a piece list is never empty: only Embedding pieces
            assert embedding is not None
            part, grad_like = embedding, embedding.rows
        if part.nbytes >= params[k].numel() * _wide(grad_like).itemsize or parts[k] is not None:
            part = _form(part, params[k].shape) + (0 if parts[k] is None else parts[k])
        parts[k] = part
    return Chunk.of(parts, [p.shape for p in params])


F = TypeVar("F", LinearFactors, EmbeddingFactors)


def _merge(found: list[F]) -> F | None:
    """One factor pair of a single kind from its token slices (None for no slice)."""
    if len(found) <= 1:
        return found[0] if found else None
    if isinstance(found[0], LinearFactors):
        return LinearFactors(torch.cat([p.x for p in found]), torch.cat([p.dy for p in found]))
    return EmbeddingFactors(torch.cat([p.ids for p in found]), torch.cat([p.rows for p in found]))


def fold_chunks(views: Sequence[Tensor], chunks: Sequence[Chunk], coefs: Sequence[float]) -> None:
    """``views[k] += sum_c coef_c grad_k(chunk_c)``: one matmul (Linear) or index_add (Embedding)
    per parameter over every chunk, computed in the views' dtype (chunks with coefficient 0 skipped)."""
    live = [(c, w) for c, w in zip(chunks, coefs) if w != 0]
    for k, view in enumerate(views):
        linear: list[tuple[LinearFactors, float]] = []
        embedding: list[tuple[EmbeddingFactors, float]] = []
        for chunk, w in live:
            part = chunk.parts[k]
            for piece in (part.linear, part.embedding) if isinstance(part, TiedFactors) else (part,):
                if isinstance(piece, LinearFactors):
                    linear.append((piece, w))
                elif isinstance(piece, EmbeddingFactors):
                    embedding.append((piece, w))
                elif piece is not None:
                    view.add_(piece.to(view.dtype), alpha=w)
        if linear:
            dy = torch.cat([p.dy.to(view.dtype) * w for p, w in linear])
            x = torch.cat([p.x for p, _ in linear]).to(view.dtype)
            view.addmm_(dy.t(), x)
        if embedding:
            rows = torch.cat([p.rows.to(view.dtype) * w for p, w in embedding])
            view.index_add_(0, torch.cat([p.ids for p, _ in embedding]), rows)
