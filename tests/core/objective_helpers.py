"""A per-token policy and the three ways of computing one objective's gradient.

- streamed: events (rewards with their verdicts, scored trajectories in small batches) in a given
  order through :class:`StreamingGRPO`;
- synchronous: every verdict first, then the whole batch in one ``add_tokens`` (the direct path);
- barrier reference: one backward of :func:`reference_loss` over the complete batch.

Engine and teacher log-probabilities are the learner's perturbed by seeded per-token noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from thundersync_lightning.core import (
    Objective,
    StreamingGRPO,
    TokenScores,
    reference_loss,
    trajectory_terms,
)

from .helpers import seed_of


class TokenPolicy(nn.Module):
    """Softmax over a small vocabulary at 1..5 scored positions per trajectory (derived from its id);
    a trajectory whose id contains ``"empty"`` is an empty completion (no scored position), one whose id
    contains ``"long"`` hit the length limit."""

    def __init__(self, dtype: torch.dtype = torch.float64, seed: int = 0, vocab: int = 6) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, vocab)).to(dtype)
        self.ref = (
            nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, vocab)).to(dtype).requires_grad_(False)
        )
        self.dtype = dtype
        self.vocab = vocab

    def _inputs(self, tid: str) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed_of(tid))
        steps = 0 if "empty" in tid else int(torch.randint(1, 6, (), generator=g))
        x = torch.randn(steps, 4, generator=g, dtype=self.dtype)  # (T, 4)
        y = torch.randint(0, self.vocab, (steps,), generator=g)  # (T,)
        return x, y

    def scores(self, tids: Sequence[str], entropy: bool = True, reference: bool = True) -> TokenScores:
        rows = [self._inputs(t) for t in tids]
        width = max(len(y) for _, y in rows) + 1  # one unscored position of padding at least
        lp = torch.zeros(len(tids), width, dtype=self.dtype)
        ent = torch.zeros(len(tids), width, dtype=self.dtype)
        ref = torch.zeros(len(tids), width, dtype=self.dtype)
        mask = torch.zeros(len(tids), width, dtype=torch.bool)
        lps, ents = [], []
        for i, (x, y) in enumerate(rows):
            logp = torch.log_softmax(self.body(x), -1)  # (T, V)
            lps.append(torch.nn.functional.pad(logp.gather(1, y[:, None]).squeeze(1), (0, width - len(y))))
            ents.append(torch.nn.functional.pad(-(logp.exp() * logp).sum(-1), (0, width - len(y))))
            with torch.no_grad():
                ref[i, : len(y)] = torch.log_softmax(self.ref(x), -1).gather(1, y[:, None]).squeeze(1)
            mask[i, : len(y)] = True
        lp = torch.stack(lps)
        ent = torch.stack(ents)
        truncated = torch.tensor(["long" in t for t in tids])  # ids containing "long" hit the length limit
        return TokenScores(lp, mask, ent if entropy else None, ref if reference else None, truncated)

    def engine(self, tids: Sequence[str], scores: TokenScores) -> torch.Tensor:
        """Engine logprobs: the learner's plus a per-trajectory perturbation (some ratios exceed 3)."""
        out = scores.logprobs.detach().clone()
        for i, t in enumerate(tids):
            g = torch.Generator().manual_seed(seed_of("engine/" + t))
            out[i] += torch.randn(out.shape[1], generator=g, dtype=self.dtype) * 0.6
        return out * scores.mask

    def teacher(self, tids: Sequence[str], scores: TokenScores) -> torch.Tensor:
        """Teacher logprobs: the learner's shifted by a per-token draw (both signs of l - p occur)."""
        out = scores.logprobs.detach().clone()
        for i, t in enumerate(tids):
            g = torch.Generator().manual_seed(seed_of("teacher/" + t))
            out[i] += torch.randn(out.shape[1], generator=g, dtype=self.dtype) * 0.8
        return out * scores.mask


def teacher_of(
    policy: TokenPolicy, obj: Objective, tids: Sequence[str], scores: TokenScores
) -> torch.Tensor | None:
    return policy.teacher(tids, scores) if obj.needs_teacher else None


@dataclass(frozen=True)
class Event:
    kind: str  # "reward" | "content"
    tid: str
    reward: float = 0.0
    failed: bool = False
    unscorable: bool = False


@dataclass(frozen=True)
class Batch:
    groups: dict[str, tuple[str, ...]]
    rewards: dict[str, float]
    failed: dict[str, bool]
    unscorable: dict[str, bool] = field(default_factory=dict)  # every reward declined it (TRL's None)

    @property
    def order(self) -> list[str]:
        return [t for ts in self.groups.values() for t in ts]

    def group_of(self, tid: str) -> str:
        return next(g for g, ts in self.groups.items() if tid in ts)


def params_of(policy: TokenPolicy) -> list[torch.Tensor]:
    return [p for p in policy.parameters() if p.requires_grad]


def _grad(params: list[torch.Tensor]) -> torch.Tensor:
    out = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    for p in params:
        p.grad = None
    return out


def streamed(
    policy: TokenPolicy,
    obj: Objective,
    batch: Batch,
    events: Sequence[Event],
    chunk: int = 1,
    filter_groups: bool = False,
) -> torch.Tensor:
    """Events in the given order; consecutive content events are scored ``chunk`` at a time."""
    params = params_of(policy)
    acc = StreamingGRPO(params, objective=obj, filter_groups=filter_groups)
    for gid, ts in batch.groups.items():
        acc.open_group(gid, ts)
    pending: list[str] = []

    def flush() -> None:
        if pending:
            s = policy.scores(pending, obj.needs_entropy, obj.needs_reference)
            acc.add_tokens(
                list(pending),
                s,
                policy.engine(pending, s),
                teacher_logprobs=teacher_of(policy, obj, pending, s),
            )
            pending.clear()

    for e in events:
        if e.kind == "reward":
            flush()
            acc.add_reward(e.tid, e.reward, failed=e.failed, unscorable=e.unscorable)
        else:
            pending.append(e.tid)
            if len(pending) >= chunk:
                flush()
    flush()
    acc.finish()
    return _grad(params)


def synchronous(
    policy: TokenPolicy, obj: Objective, batch: Batch, filter_groups: bool = False
) -> torch.Tensor:
    events = [
        Event("reward", t, batch.rewards[t], batch.failed[t], batch.unscorable.get(t, False))
        for t in batch.order
    ]
    events += [Event("content", t) for t in batch.order]
    return streamed(policy, obj, batch, events, chunk=len(batch.order), filter_groups=filter_groups)


def barrier(policy: TokenPolicy, obj: Objective, batch: Batch) -> torch.Tensor:
    params = params_of(policy)
    tids = batch.order
    s = policy.scores(tids, obj.needs_entropy, obj.needs_reference)
    terms = trajectory_terms(obj, s, policy.engine(tids, s), teacher_of(policy, obj, tids, s))
    loss = reference_loss(
        obj,
        terms,
        [batch.group_of(t) for t in tids],
        [batch.rewards[t] for t in tids],
        [batch.failed[t] for t in tids],
        unscorable=[batch.unscorable.get(t, False) for t in tids],
    )
    loss.backward()
    return _grad(params)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = max(float(b.norm()), 1e-30)
    return float((a - b).norm()) / scale
