"""Each job's parameter gradients from one recorded forward and its output gradient (one pass).

A record is one parameterised module's forward over some batch rows: input X, output Y, and the
batch row of each dim-0 position. Given dY for one pass of
:func:`~thundersync_lightning.backends.split.backward.split_gradients` (each row feeding one job), job j's
gradient of the module's parameters is taken from its own
positions: ``nn.Linear`` dY_j^T X_j (and sum dY_j for the bias), ``nn.Embedding`` dY_j added at the
token ids, RMSNorm-style scales sum(dY_j * f(X_j)), any other module the VJP of its own forward on
those rows. Several jobs of one record share batched ops (:func:`_segment_grads`) while the
per-position gradients stay under :data:`SEGMENT_BYTES`. A job kept as factors
(:mod:`~thundersync_lightning.backends.split.factors`) gets its Linear/Embedding weight as (X_j, dY_j) pieces
instead, gathered once per record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from ...core.accumulator.jobs import Grads
from .factors import EmbeddingFactors, Factors, LinearFactors

__all__ = ["Record", "Owners", "Layout", "Layouts", "module_grads", "SEGMENT_BYTES"]


@dataclass(frozen=True, slots=True)
class Record:
    module: nn.Module
    inputs: Tensor
    output: Tensor
    rows: tuple[int, ...]  # the batch rows of dim 0, in order


class Owners(Protocol):
    """What the capture knows about a module: its trainable parameters and whether it is a scale."""

    def owned(self, module: nn.Module) -> list[tuple[str, nn.Parameter]]: ...

    def is_scale(self, module: nn.Module) -> bool: ...


@dataclass(frozen=True, slots=True)
class Layout:
    """One forward's rows in one pass: each job's positions, and every position's job slot."""

    by_job: dict[int, list[int]]
    slots: Tensor  # (b,): slot of each position; len(by_job) for positions feeding no job
    at: dict[int, Tensor]  # each job's positions as an index tensor (shared by the forward's records)

    @staticmethod
    def of(
        rows: tuple[int, ...], owner: list[int], device: torch.device, jobs: Callable[[int], bool]
    ) -> Layout:
        by_job: dict[int, list[int]] = {}
        for pos, row in enumerate(rows):
            if owner[row] >= 0 and jobs(owner[row]):
                by_job.setdefault(owner[row], []).append(pos)
        slot = {j: k for k, j in enumerate(by_job)}
        slots = torch.tensor([slot.get(owner[row], len(slot)) for row in rows], device=device)
        return Layout(by_job, slots, {j: torch.tensor(p, device=device) for j, p in by_job.items()})


class Layouts:
    """The layouts of one pass, built once per forward (records of a forward share their rows):
    every job, the jobs kept dense, and the jobs kept as factors."""

    def __init__(self, owner: list[int], factor: list[bool], device: torch.device) -> None:
        self._owner, self._factor, self._device = owner, factor, device
        self._built: dict[tuple[int, str], Layout] = {}

    def get(self, rows: tuple[int, ...], which: str = "all") -> Layout:
        layout = self._built.get((id(rows), which))
        if layout is None:
            factor = self._factor
            jobs = {"all": lambda j: True, "dense": lambda j: not factor[j], "factor": lambda j: factor[j]}[
                which
            ]
            layout = self._built[(id(rows), which)] = Layout.of(rows, self._owner, self._device, jobs)
        return layout


def module_grads(
    capture: Owners,
    index: dict[int, int],
    record: Record,
    dy: Tensor,
    layouts: Layouts,
    out: list[Grads],
    pieces: list[dict[int, list[Factors]]],
) -> None:
    """Add the module's per-job parameter gradients of this pass to ``out``; a Linear or
    Embedding weight of a job kept as factors goes to ``pieces`` instead."""
    module, owned = record.module, capture.owned(record.module)
    weighted = isinstance(module, (nn.Linear, nn.Embedding)) and any(n == "weight" for n, _ in owned)
    factored = layouts.get(record.rows, "factor") if weighted else None
    if factored is None or not factored.by_job:
        _dense_grads(capture, index, record, dy, layouts.get(record.rows), owned, out)
        return
    _factor_pieces(module, record.inputs, dy, factored, index[id(module.weight)], pieces)
    _dense_grads(capture, index, record, dy, layouts.get(record.rows, "dense"), owned, out)
    rest = [(n, p) for n, p in owned if n != "weight"]
    if rest:  # the bias of the factored jobs stays dense (out values each)
        _dense_grads(capture, index, record, dy, factored, rest, out)


def _factor_pieces(
    module: nn.Module, x: Tensor, dy: Tensor, layout: Layout, k: int, pieces: list[dict[int, list[Factors]]]
) -> None:
    """Each job's (x, dy) token rows for the Linear weight ``k`` ((ids, dy) for an Embedding;
    padding ids left out), one gather per job and tensor (each piece owns its storage)."""
    for j, positions in layout.by_job.items():
        if len(positions) == x.shape[0]:
            xs, ds = x.clone(), dy.clone()
        else:
            xs, ds = x.index_select(0, layout.at[j]), dy.index_select(0, layout.at[j])
        if isinstance(module, nn.Embedding):
            ids, rows = xs.reshape(-1), ds.reshape(-1, ds.shape[-1])
            if module.padding_idx is not None:
                keep = ids.ne(module.padding_idx)
                ids, rows = ids[keep], rows[keep]
            pieces[j].setdefault(k, []).append(EmbeddingFactors(ids, rows))
        else:
            pieces[j].setdefault(k, []).append(
                LinearFactors(xs.reshape(-1, xs.shape[-1]), ds.reshape(-1, ds.shape[-1]))
            )


def _dense_grads(
    capture: Owners,
    index: dict[int, int],
    record: Record,
    dy: Tensor,
    layout: Layout,
    owned: list[tuple[str, nn.Parameter]],
    out: list[Grads],
) -> None:
    """Add the ``owned`` parameters' per-job gradients of this pass to ``out`` (dense)."""
    by_job = layout.by_job
    if not by_job:
        return
    module = record.module
    x = record.inputs
    scale = capture.is_scale(module)
    if scale:  # y = w * f(x): f once for the whole record, then sum(dy * f) per job
        with torch.no_grad():
            x = torch.func.functional_call(module, {"weight": torch.ones_like(module.weight)}, (x,))
    if len(by_job) > 1 and (isinstance(module, (nn.Linear, nn.Embedding)) or scale):
        segmented = _segment_grads(module, owned, x, dy, layout.slots, len(by_job) + 1, scale)
        if segmented is not None:  # every job of the record in a few batched ops
            for name, per_job in segmented:
                k = index[id(getattr(module, name))]
                for j, grad in zip(by_job, per_job.unbind(0)):  # slots follow by_job's order
                    out[j][k] = grad if out[j][k] is None else out[j][k] + grad  # type: ignore[operator]
            return
    for j, pos in by_job.items():
        if len(pos) == x.shape[0]:
            xs, ds = x, dy
        else:
            xs, ds = x.index_select(0, layout.at[j]), dy.index_select(0, layout.at[j])
        if scale:
            grads = [("weight", (ds * xs).reshape(-1, xs.shape[-1]).sum(0).to(module.weight.dtype))]
        else:
            grads = _param_grads(module, owned, xs, ds)
        for name, grad in grads:
            k = index[id(getattr(module, name))]
            out[j][k] = grad if out[j][k] is None else out[j][k] + grad  # type: ignore[operator]


#: Bytes of per-row weight gradients a record may take to split its jobs in one batched matmul;
#: above it (large layers, where a matmul per job costs little extra) each job takes its own.
SEGMENT_BYTES = 4 * 2**20


def _segment_grads(
    module: nn.Module,
    owned: list[tuple[str, nn.Parameter]],
    x: Tensor,
    dy: Tensor,
    slots: Tensor,
    m: int,
    scale: bool,
) -> list[tuple[str, Tensor]] | None:
    """Each slot's parameter gradients, (m, *shape), for rows assigned to ``slots`` (b,)."""
    names = {n for n, _ in owned}
    b = x.shape[0]
    if scale:
        wide = torch.promote_types(dy.dtype, torch.float32)
        per_row = (dy.to(wide) * x.to(wide)).reshape(b, -1, x.shape[-1]).sum(1)  # (b, d)
        return [
            (
                "weight",
                per_row.new_zeros(m, x.shape[-1]).index_add_(0, slots, per_row).to(module.weight.dtype),
            )
        ]
    if isinstance(module, nn.Embedding):
        ids = x.reshape(b, -1)
        wide = torch.promote_types(dy.dtype, torch.float32)
        rows = dy.reshape(b, ids.shape[1], -1).to(wide)
        keep = (
            ids.ne(module.padding_idx)
            if module.padding_idx is not None
            else torch.ones_like(ids, dtype=torch.bool)
        )
        flat = (slots[:, None] * module.num_embeddings + ids)[keep]
        table = rows.new_zeros(m * module.num_embeddings, module.embedding_dim).index_add_(
            0, flat, rows[keep]
        )
        return [
            ("weight", table.view(m, module.num_embeddings, module.embedding_dim).to(module.weight.dtype))
        ]
    assert isinstance(module, nn.Linear)
    wide = torch.promote_types(dy.dtype, torch.float32)  # per-row sums of low-precision rows add up in fp32
    d3 = dy.reshape(b, -1, dy.shape[-1]).to(wide)
    result = []
    if "weight" in names:
        if b * module.weight.numel() * d3.element_size() > SEGMENT_BYTES:
            return None
        per_row = torch.bmm(d3.transpose(1, 2), x.reshape(b, -1, x.shape[-1]).to(wide))  # (b, out, in)
        summed = per_row.new_zeros(m, *per_row.shape[1:]).index_add_(0, slots, per_row)
        result.append(("weight", summed.to(module.weight.dtype)))
    if "bias" in names:
        result.append(
            ("bias", d3.new_zeros(m, d3.shape[-1]).index_add_(0, slots, d3.sum(1)).to(module.bias.dtype))
        )
    return result


def _param_grads(
    module: nn.Module, owned: list[tuple[str, nn.Parameter]], x: Tensor, dy: Tensor
) -> list[tuple[str, Tensor]]:
    names = {n for n, _ in owned}
    if isinstance(module, nn.Linear):
        d2 = dy.reshape(-1, dy.shape[-1])
        result = []
        if "weight" in names:
            result.append(
                ("weight", (d2.t() @ x.reshape(-1, x.shape[-1]).to(d2.dtype)).to(module.weight.dtype))
            )
        if "bias" in names:
            result.append(("bias", d2.sum(0).to(module.bias.dtype)))
        return result
    if isinstance(module, nn.Embedding):
        ids = x.reshape(-1)
        rows = dy.reshape(-1, dy.shape[-1]).to(module.weight.dtype)
        if module.padding_idx is not None:
            keep = ids.ne(module.padding_idx)
            ids, rows = ids[keep], rows[keep]
        return [("weight", torch.zeros_like(module.weight).index_add_(0, ids, rows))]
    # any other module: the VJP of its own forward on these rows, for its parameters only
    local = {n: p.detach().requires_grad_(True) for n, p in owned}
    with torch.enable_grad():
        y = torch.func.functional_call(module, local, (x,))
        grads = torch.autograd.grad(y, list(local.values()), dy, allow_unused=True)
    return [(n, g) for n, g in zip(local, grads) if g is not None]
