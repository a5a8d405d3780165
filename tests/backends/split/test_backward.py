"""Split backward (the backend): one backward, parameter gradients split by row, for every module kind;
models it cannot split exactly are refused (strict) or fall back to per-destination passes."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
import torch
from torch import nn

from thundersync_lightning.backends.split import RowCapture, SplitBackend, unsupported_modules
from thundersync_lightning.core import StreamingGRPO, TokenScores
from thundersync_lightning.core.errors import ConfigError

VOCAB, WIDTH = 7, 6


class Scale(nn.Module):
    """RMS normalisation times a learned scale: y = w * f(x)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(WIDTH, dtype=torch.float64) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class RowModel(nn.Module):
    """Token ids (n, T) -> logits (n, T, V), row by row; every kind of module the split handles."""

    def __init__(self, mode: str = "honest") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.mode = mode
        self.embed = nn.Embedding(VOCAB, WIDTH, padding_idx=0, dtype=torch.float64)
        self.scale = Scale()
        self.mix = nn.Linear(WIDTH, WIDTH, dtype=torch.float64)  # with bias
        self.norm = nn.LayerNorm(WIDTH, dtype=torch.float64)  # weight and bias: the generic path
        self.head = nn.Linear(WIDTH, VOCAB, bias=False, dtype=torch.float64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.scale(self.embed(ids))
        if self.mode == "rows-interact":
            h = h - h.mean(0, keepdim=True)
        h = torch.tanh(self.mix(h)) if self.mode != "keyword" else torch.tanh(self.mix(input=h))
        out = self.head(self.norm(h))
        if self.mode == "tied-outside":  # the embedding reused outside its module: invisible to hooks
            out = out + nn.functional.linear(h, self.embed.weight)
        return out


def rows_of(tid: str) -> list[int]:
    g = torch.Generator().manual_seed(sum(map(ord, tid)))
    return [
        int(x) for x in torch.randint(1, VOCAB, (2 + int(torch.randint(0, 4, (), generator=g)),), generator=g)
    ]


def score(model: RowModel, tids: Sequence[str], capture: RowCapture | None) -> TokenScores:
    """Two micro-batches in a permuted order (the capture maps each forward's rows back)."""
    n = len(tids)
    order = [list(range(1, n, 2)), list(range(0, n, 2))]
    width = max(len(rows_of(t)) for t in tids)
    lp = [torch.zeros(width - 1, dtype=torch.float64)] * n
    mask = torch.zeros(n, width - 1, dtype=torch.bool)
    for chunk in order:
        ids = torch.zeros(len(chunk), width, dtype=torch.long)  # padding id 0
        for r, i in enumerate(chunk):
            seq = rows_of(tids[i])
            ids[r, : len(seq)] = torch.tensor(seq)
            mask[i, : len(seq) - 1] = True
        if capture is not None:
            with capture.rows(chunk):
                logits = model(ids)
        else:
            logits = model(ids)
        token_lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        for r, i in enumerate(chunk):
            lp[i] = token_lp[r]
    return TokenScores(torch.stack(lp) * mask, mask)


IDS = [f"t{g}-{i}" for g in range(3) for i in range(3)]
REWARDS = {t: float(sum(map(ord, t)) % 2) for t in IDS}
EARLY = ["t0-0", "t0-1", "t0-2", "t1-0"]  # group 0 direct, group 1 one bucket, group 2 held


def step(model: RowModel, backend: SplitBackend | None, fail_first: bool = False) -> tuple[torch.Tensor, int]:
    params = [p for p in model.parameters() if p.requires_grad]
    acc = StreamingGRPO(params, backend=backend)
    capture = backend.capture if backend is not None else None
    for g in range(3):
        acc.open_group(f"g{g}", [f"t{g}-{i}" for i in range(3)])
    for t in EARLY:
        acc.add_reward(t, REWARDS[t])
    if capture is not None:
        with capture:
            scores = score(model, IDS, capture)
    else:
        scores = score(model, IDS, None)
    if fail_first:
        with pytest.raises(ConfigError, match="split"):
            acc.add_tokens(IDS, scores, watch=capture)
        assert acc.held_trajectories == 0  # nothing half-applied: the same batch goes in once more
        scores = score(model, IDS, None)
        acc.add_tokens(IDS, scores)
    else:
        acc.add_tokens(IDS, scores, watch=capture)
    for t in IDS:
        if t not in EARLY:
            acc.add_reward(t, REWARDS[t])
    for p in params:
        p.grad = None
    report = acc.finish()
    return torch.cat([p.grad.reshape(-1) for p in params]), report.backward_passes


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return float((a - b).norm() / b.norm()) <= 1e-10


def test_linear_embedding_scale_and_generic_modules_split_exactly():
    model = RowModel()
    reference, jobs = step(model, None)
    backend = SplitBackend(model, list(model.parameters()), strict=True)
    split, passes = step(model, backend)
    assert close(split, reference) and backend.verified
    assert (jobs, passes) == (1 + 1 + 5, 1)  # direct, one bucket, five held rows: one backward
    again, _ = step(model, backend)
    assert close(again, reference)


@pytest.mark.parametrize("mode", ["tied-outside", "rows-interact"])
def test_a_model_the_split_cannot_see_is_refused_at_first_use_and_nothing_is_applied(mode, caplog):
    model = RowModel(mode)
    reference, _ = step(model, None)
    strict = SplitBackend(model, list(model.parameters()), strict=True)
    after, _ = step(model, strict, fail_first=True)
    assert close(after, reference)
    lenient = SplitBackend(model, list(model.parameters()), strict=False)
    assert lenient.destinations > 1 and lenient.watch(2) is lenient.capture and lenient.watch(1) is None
    with caplog.at_level(logging.WARNING, logger="thundersync_lightning.backends.split.backend"):
        fallback, passes = step(model, lenient)
    assert "differs from the per-job backward" in (lenient.refused or "") and not lenient.verified
    assert close(fallback, reference) and passes == 7
    # refused: the rest of the fit runs as the plain backend, after one warning
    assert lenient.destinations == 1 and lenient.watch(2) is None
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "split_backward='auto' turned off for this fit"
    ]


def test_a_module_called_with_keywords_is_refused_and_the_lenient_capture_falls_back():
    model = RowModel("keyword")
    reference, _ = step(model, None)
    step(model, SplitBackend(model, list(model.parameters())), fail_first=True)
    lenient = SplitBackend(model, list(model.parameters()), strict=False)
    fallback, passes = step(model, lenient)
    assert "Linear is not called with one batch-first tensor" in (lenient.refused or "")
    assert close(fallback, reference) and passes == 7


def test_models_that_cannot_be_split_are_named_before_any_forward():
    model = RowModel()
    model.embed = nn.Embedding(VOCAB, WIDTH, max_norm=1.0, dtype=torch.float64)
    model.extra = nn.Parameter(torch.zeros(1))  # owned by a module with submodules
    model.head.gradient_checkpointing = True
    problems = unsupported_modules(model, list(model.parameters()))
    assert any("max_norm" in p for p in problems)
    assert any("module with submodules owns" in p for p in problems)
    assert any("gradient checkpointing" in p for p in problems)
    stray = torch.zeros(3, requires_grad=True)
    assert any("belong to no module" in p for p in unsupported_modules(RowModel(), [stray]))
    with pytest.raises(ConfigError, match="cannot be split by row"):
        RowCapture(model, list(model.parameters()))


def test_a_forward_outside_rows_and_a_split_while_recording_are_errors():
    model = RowModel()
    capture = RowCapture(model, list(model.parameters()))
    with capture, pytest.raises(RuntimeError, match="outside capture.rows"):
        model(torch.ones(1, 3, dtype=torch.long))
    with torch.no_grad(), capture:  # no graph: nothing to record, no rows needed
        model(torch.ones(1, 3, dtype=torch.long))
    assert capture.records == []


def test_layers_too_large_to_segment_at_once_take_one_matmul_per_job(monkeypatch):
    import thundersync_lightning.backends.split.row_grads as row_grads

    monkeypatch.setattr(row_grads, "SEGMENT_BYTES", 0)
    model = RowModel()
    reference, _ = step(model, None)
    split, passes = step(model, SplitBackend(model, list(model.parameters())))
    assert close(split, reference) and passes == 1
