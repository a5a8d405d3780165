"""Factor chunks: a destination's Linear/Embedding weight gradient kept as (X, dY) until its
coefficient is known, formed in one matmul per parameter at the fold; exact in every reward order,
never more bytes than the dense gradients it stands for."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from torch import nn

from thundersync_lightning.backends.split import RowCapture, SplitBackend
from thundersync_lightning.backends.split.factors import (
    Chunk,
    EmbeddingFactors,
    LinearFactors,
    TiedFactors,
    chunk_of,
    fold_chunks,
)
from thundersync_lightning.core import Objective, StreamingGRPO, TokenScores

VOCAB, WIDTH = 40, 32  # wide enough that a short row's factors take fewer bytes than a weight


def test_fold_equals_the_coefficient_weighted_sum_of_the_formed_chunks():
    g = torch.Generator().manual_seed(0)
    params = [
        torch.zeros(9, 8, dtype=torch.float64),
        torch.zeros(50, 4, dtype=torch.float64),
        torch.zeros(9, dtype=torch.float64),
    ]
    chunks = []
    for n in (2, 3, 1):
        x, dy = (
            torch.randn(n, 8, generator=g, dtype=torch.float64),
            torch.randn(n, 9, generator=g, dtype=torch.float64),
        )
        ids, rows = (
            torch.randint(0, 50, (n,), generator=g),
            torch.randn(n, 4, generator=g, dtype=torch.float64),
        )
        bias = torch.randn(9, generator=g, dtype=torch.float64)
        chunks.append(
            chunk_of(
                [None, None, bias],
                {
                    0: [LinearFactors(x[:1], dy[:1]), LinearFactors(x[1:], dy[1:])],
                    1: [EmbeddingFactors(ids, rows)],
                },
                params,
            )
        )
    assert isinstance(chunks[0].parts[0], LinearFactors) and isinstance(chunks[0].parts[1], EmbeddingFactors)
    coefs = [0.7, 0.0, -2.5]
    views = [torch.zeros_like(p) for p in params]
    fold_chunks(views, chunks, coefs)
    for k, view in enumerate(views):
        expected = sum(c * chunk.dense()[k] for chunk, c in zip(chunks, coefs))
        assert torch.allclose(view, expected, rtol=0, atol=1e-12)


def test_a_part_whose_factors_outweigh_its_gradient_is_formed_at_once():
    params = [torch.zeros(4, 3)]
    x, dy = torch.randn(5, 3), torch.randn(5, 4)  # 5 * (3 + 4) values > 4 * 3
    chunk = chunk_of([None], {0: [LinearFactors(x, dy)]}, params)
    assert isinstance(chunk.parts[0], torch.Tensor) and torch.allclose(chunk.parts[0], dy.t() @ x)
    assert chunk.nbytes == 4 * 3 * 4
    small = chunk_of([None], {0: [LinearFactors(x[:1], dy[:1])]}, params)
    assert isinstance(small.parts[0], LinearFactors) and small.nbytes == (3 + 4) * 4 < 4 * 3 * 4


class Model(nn.Module):
    """Token ids (n, T) -> logits; Embedding, a scale, Linear with bias, LayerNorm, Linear head."""

    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, WIDTH, padding_idx=0, dtype=torch.float64)
        self.scale = nn.RMSNorm(WIDTH, dtype=torch.float64)
        self.mix = nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
        self.norm = nn.LayerNorm(WIDTH, dtype=torch.float64)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False, dtype=torch.float64)
        if tied:  # one (VOCAB, WIDTH) matrix as input embedding and output head, as in many HF models
            self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(torch.tanh(self.mix(self.scale(self.embed(ids))))))


def seq(tid: str) -> list[int]:
    g = torch.Generator().manual_seed(sum(map(ord, tid)))
    return [
        int(x) for x in torch.randint(1, VOCAB, (3 + int(torch.randint(0, 3, (), generator=g)),), generator=g)
    ]


def scores(
    model: Model, tids: Sequence[str], capture: RowCapture | None, reference: bool = False
) -> TokenScores:
    width = max(len(seq(t)) for t in tids)
    ids = torch.zeros(len(tids), width, dtype=torch.long)
    mask = torch.zeros(len(tids), width - 1, dtype=torch.bool)
    for i, t in enumerate(tids):
        ids[i, : len(seq(t))] = torch.tensor(seq(t))
        mask[i, : len(seq(t)) - 1] = True
    if capture is not None:
        with capture, capture.rows(range(len(tids))):
            logits = model(ids)
    else:
        logits = model(ids)
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1) * mask
    ref = (lp.detach() * 0.9) if reference else None
    return TokenScores(lp, mask, None, ref)


GROUPS = {f"g{g}": [f"t{g}-{i}" for i in range(4)] for g in range(3)}
REWARDS = {
    "g0": [1.0, 0.0, 1.0, 0.0],
    "g1": [0.5, 1.0, 0.0, 0.25],  # more than two distinct values
    "g2": [1.0, 1.0, 1.0, 1.0],  # zero advantage
}
ORDERS = {  # which rewards land before the first scored batch, and the batches
    "held": (
        [],
        [["t0-0", "t1-0", "t2-0", "t0-1"], ["t0-2", "t0-3", "t1-1", "t1-2", "t1-3", "t2-1", "t2-2", "t2-3"]],
    ),
    "known": (
        ["t0-0", "t0-1", "t1-0", "t1-1", "t1-2"],
        [["t0-0", "t0-1", "t1-0", "t1-1", "t1-2", "t0-2"], ["t0-3", "t1-3", "t2-0", "t2-1", "t2-2", "t2-3"]],
    ),
    "one-by-one": (["t0-0"], [[t] for ts in GROUPS.values() for t in ts]),
}


def run(
    order: str,
    split: bool,
    objective: Objective | None = None,
    failed: Sequence[str] = (),
    tied: bool = False,
) -> tuple[torch.Tensor, StreamingGRPO, list[int]]:
    """The step's gradient, the accumulator, and after each batch the chunks holding Linear factors
    (of the tied weight, both kinds, when ``tied``)."""
    objective = objective or Objective()
    model = Model(tied)
    params = list(model.parameters())
    backend = SplitBackend(model, params) if split else None
    capture = backend.capture if backend is not None else None
    acc = StreamingGRPO(params, objective=objective, backend=backend)
    rewards = {t: r for g, ts in GROUPS.items() for t, r in zip(ts, REWARDS[g])}
    for g, ts in GROUPS.items():
        acc.open_group(g, ts)
    early, batches = ORDERS[order]
    for t in early:
        acc.add_reward(t, rewards[t], failed=t in failed)
    chunked = []
    for batch in batches:
        batch = [t for t in batch if acc.needs_score(t)]
        if batch:
            acc.add_tokens(batch, scores(model, batch, capture, objective.needs_reference), watch=capture)
        kept = [
            h for grp in acc._groups.values() for h in (*grp._held.values(), *grp._held_regulariser.values())
        ]
        kept += [c for grp in acc._groups.values() for _, c in grp._deferred]
        kinds = (TiedFactors,) if tied else (LinearFactors,)
        chunked.append(sum(isinstance(c, Chunk) and any(isinstance(p, kinds) for p in c.parts) for c in kept))
    for t in rewards:
        if t not in early:
            acc.add_reward(t, rewards[t], failed=t in failed)
    acc.finish()
    return torch.cat([p.grad.reshape(-1) for p in params]), acc, chunked


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return float((a - b).norm() / b.norm()) <= 1e-10


@pytest.mark.parametrize("order", list(ORDERS))
def test_the_split_keeps_chunks_and_equals_the_dense_gradient_in_every_reward_order(order):
    reference, dense, _ = run(order, split=False)
    got, split, chunked = run(order, split=True)
    assert close(got, reference) and max(chunked) > 0
    assert split.peak_bytes.device <= dense.peak_bytes.device
    assert split.peak_held_bytes < dense.peak_held_bytes or dense.peak_held_bytes == 0
    assert split.bytes_in_use.total == 0


@pytest.mark.parametrize("order", list(ORDERS))
def test_a_weight_tied_between_the_embedding_and_the_head_keeps_both_kinds_of_factors(order):
    reference, _, _ = run(order, split=False, tied=True)
    got, _, chunked = run(order, split=True, tied=True)
    assert (
        len(got) == sum(p.numel() for p in Model().parameters()) - VOCAB * WIDTH
    )  # one tied matrix, not two
    assert close(got, reference) and max(chunked) > 0


def test_a_parameter_with_both_kinds_of_factors_keeps_both_or_with_a_dense_part_sums_all_three():
    g = torch.Generator().manual_seed(1)
    params = [torch.zeros(VOCAB, 4, dtype=torch.float64)]
    x, dy = (
        torch.randn(2, 4, generator=g, dtype=torch.float64),
        torch.randn(2, VOCAB, generator=g, dtype=torch.float64),
    )
    ids, rows = torch.tensor([3, 3, 7]), torch.randn(3, 4, generator=g, dtype=torch.float64)
    dense = torch.randn(VOCAB, 4, generator=g, dtype=torch.float64)
    chunk = chunk_of([dense], {0: [LinearFactors(x, dy), EmbeddingFactors(ids, rows)]}, params)
    expected = dy.t() @ x + torch.zeros(VOCAB, 4, dtype=torch.float64).index_add_(0, ids, rows) + dense
    assert isinstance(chunk.parts[0], torch.Tensor) and torch.allclose(
        chunk.parts[0], expected, rtol=0, atol=1e-12
    )
    tied = chunk_of([None], {0: [LinearFactors(x, dy), EmbeddingFactors(ids, rows)]}, params)
    assert isinstance(tied.parts[0], TiedFactors) and tied.nbytes < VOCAB * 4 * 8
    view = torch.zeros(VOCAB, 4, dtype=torch.float64)
    fold_chunks([view], [tied, chunk], [2.0, -1.0])
    assert torch.allclose(view, 2 * tied.dense()[0] - expected, rtol=0, atol=1e-12)
    assert torch.allclose(tied.dense()[0], expected - dense, rtol=0, atol=1e-12)


def test_held_regulariser_chunks_join_the_step_or_vanish_with_a_dropped_member(monkeypatch):
    from thundersync_lightning.core.accumulator import group as group_module

    taken = []
    original = group_module.GroupSums.take

    def spy(self, destination, grads, store):
        taken.append((destination.kind, isinstance(grads, Chunk)))
        original(self, destination, grads, store)

    monkeypatch.setattr(group_module.GroupSums, "take", spy)
    objective = Objective(kl_coef=0.1, failed="drop")
    reference, _, _ = run("held", split=False, objective=objective, failed=["t0-1", "t1-2"])
    got, _, chunked = run("held", split=True, objective=objective, failed=["t0-1", "t1-2"])
    assert close(got, reference) and max(chunked) > 0
    assert ("regulariser_held", True) in taken and ("held", True) in taken  # both kinds were kept as chunks


def test_chunks_spill_into_dense_sums_when_they_would_outweigh_them(monkeypatch):
    """A buffer too small for the chunks: they are formed into the sums, same gradient."""
    from thundersync_lightning.core.accumulator import group as group_module

    spilled = []
    original = group_module.GroupSums._spill

    def spy(self, store):
        spilled.append(len(self._deferred))
        original(self, store)

    monkeypatch.setattr(group_module.GroupSums, "_spill", spy)
    monkeypatch.setattr(group_module.GroupSums, "_fits", lambda self, item, reward, size: not self._deferred)
    reference, _, _ = run("known", split=False)
    got, _, _ = run("known", split=True)
    assert close(got, reference) and max(spilled) >= 1


def test_a_dense_gradient_into_a_group_with_chunks_spills_them_first(monkeypatch):
    model = Model()
    params = list(model.parameters())
    from thundersync_lightning.core.accumulator import group as group_module

    spilled = []
    original = group_module.GroupSums._spill
    monkeypatch.setattr(
        group_module.GroupSums,
        "_spill",
        lambda self, store: (spilled.append(len(self._deferred)), original(self, store)),
    )
    results = []
    for split in (False, True):
        backend = SplitBackend(model, params) if split else None
        capture = backend.capture if backend is not None else None
        acc = StreamingGRPO(params, backend=backend)
        acc.open_group("g", ["a", "b", "c"])
        for t, r in (("a", 1.0), ("b", 0.0), ("c", 1.0)):
            acc.add_reward(t, r) if t != "c" else None
        acc.add_tokens(["a", "b"], scores(model, ["a", "b"], capture), watch=capture)
        assert (len(acc._groups["g"]._deferred) == 2) == split
        acc.add_tokens(["c"], scores(model, ["c"], None))  # dense and held: the chunks stay
        assert (len(acc._groups["g"]._deferred) == 2) == split
        group = acc._groups["g"]
        acc.add_reward("c", 1.0)  # the held dense gradient joins the sums: the chunks spill first
        assert not group._deferred and group.has_dense_sums is False  # folded and dropped: complete
        for p in params:
            p.grad = None
        acc.finish()
        results.append(torch.cat([p.grad.reshape(-1) for p in params]))
    assert close(results[1], results[0]) and 2 in spilled


def test_aborting_a_group_with_chunks_frees_them():
    model = Model()
    params = list(model.parameters())
    backend = SplitBackend(model, params)
    acc = StreamingGRPO(params, backend=backend)
    acc.open_group("g", ["a", "b"])
    acc.add_tokens(["a", "b"], scores(model, ["a", "b"], backend.capture), watch=backend.capture)
    assert acc.held_trajectories == 2 and 0 < acc.bytes_in_use.device < 2 * 4 * 8 * sum(
        p.numel() for p in params
    )
    acc.abort_group("g")
    assert acc.bytes_in_use.total == 0 and acc.held_trajectories == 0


def test_offloaded_sums_stay_dense():
    model = Model()
    params = list(model.parameters())
    backend = SplitBackend(model, params)
    acc = StreamingGRPO(params, offload="cpu", backend=backend)
    acc.open_group("g", ["a", "b"])
    acc.add_tokens(["a", "b"], scores(model, ["a", "b"], backend.capture), watch=backend.capture)
    assert all(isinstance(h, torch.Tensor) for h in acc._groups["g"]._held.values())


def pair_step(model: Model, split: bool = False, factors: bool = True) -> tuple[torch.Tensor, list]:
    """A two-member group scored before its rewards: the step's gradient and what was held."""
    params = list(model.parameters())
    backend = SplitBackend(model, params, factors=factors) if split else None
    capture = backend.capture if backend is not None else None
    acc = StreamingGRPO(params, backend=backend)
    acc.open_group("g", ["a", "b"])
    acc.add_tokens(["a", "b"], scores(model, ["a", "b"], capture), watch=capture)
    held = list(acc._groups["g"]._held.values())
    acc.add_reward("a", 1.0)
    acc.add_reward("b", 0.0)
    acc.finish()
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    return grad, held


@pytest.mark.parametrize("factors", [True, False])
def test_factors_false_keeps_every_destination_dense_with_the_same_gradient(factors):
    model = Model()
    got, held = pair_step(model, split=True, factors=factors)
    assert len(held) == 2 and all(isinstance(h, Chunk) == factors for h in held)
    reference, _ = pair_step(model)
    assert close(got, reference)


def test_factors_must_be_a_bool():
    from thundersync_lightning.core.errors import ConfigError

    model = Model()
    with pytest.raises(ConfigError, match="factors must be True or False"):
        SplitBackend(model, list(model.parameters()), factors="yes")  # type: ignore[arg-type]
