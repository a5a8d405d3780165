"""Policies, batches and the barrier reference the streaming tests compare against.

The reference is the synchronous GRPO gradient: one backward of

    L = -(1/N) * sum_g sum_{i in g} A_i * S_i,    A = core.advantages(rewards of g)

taken on freshly computed scores, so it shares no state with the accumulator under test.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from thundersync_lightning.core import StreamingGRPO, StreamingReport, advantages

Score = Callable[[str], torch.Tensor]


def seed_of(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), "little")


class MLPPolicy(nn.Module):
    """A two-layer softmax policy over a few "tokens" per trajectory (fast; any dtype)."""

    def __init__(self, dtype: torch.dtype = torch.float32, seed: int = 0, vocab: int = 7) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.vocab = vocab
        self.body = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, vocab)).to(dtype)
        self.dtype = dtype

    def score(self, trajectory_id: str) -> torch.Tensor:
        """S_i = sum_t w_t log pi(y_t | x_t) over 3..5 scored steps derived from the id."""
        g = torch.Generator().manual_seed(seed_of(trajectory_id))
        steps = int(torch.randint(3, 6, (), generator=g))
        drawn = (
            self.dtype if self.dtype in (torch.float32, torch.float64) else torch.float32
        )  # same draws in bf16
        x = torch.randn(steps, 5, generator=g, dtype=drawn).to(self.dtype)  # (T, 5)
        y = torch.randint(0, self.vocab, (steps,), generator=g)  # (T,)
        w = (torch.rand(steps, generator=g, dtype=drawn) + 0.5).to(
            self.dtype
        )  # reward-independent token weights
        logp = torch.log_softmax(self.body(x), dim=-1)  # (T, V)
        return (w * logp.gather(1, y[:, None]).squeeze(1)).sum()


class QwenPolicy:
    """A randomly initialised tiny transformers Qwen3 (no download); S_i sums scored-token logprobs."""

    def __init__(self, dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        config = Qwen3Config(
            vocab_size=32,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=64,
            tie_word_embeddings=False,
            # eager attention and RMSNorm compute in float32 whatever the model dtype; in float64
            # use sdpa and a dtype-preserving norm so the whole model really is float64.
            attn_implementation="sdpa" if dtype == torch.float64 else "eager",
        )
        torch.manual_seed(seed)
        self.model = Qwen3ForCausalLM(config).to(dtype).eval()  # eval: no dropout
        if dtype == torch.float64:
            for module in self.model.modules():
                if type(module).__name__ == "Qwen3RMSNorm":
                    module.forward = functools.partial(_rms_norm_in_input_dtype, module)
        self.vocab = config.vocab_size

    def parameters(self) -> list[nn.Parameter]:
        return list(self.model.parameters())

    def score(self, trajectory_id: str) -> torch.Tensor:
        """Prompt (unscored), action (scored), observation (unscored), action (scored)."""
        g = torch.Generator().manual_seed(seed_of(trajectory_id))
        lengths = torch.randint(1, 4, (4,), generator=g).tolist()
        tokens = torch.randint(0, self.vocab, (sum(lengths) + 1,), generator=g)  # (T,)
        scored = torch.zeros(tokens.numel(), dtype=torch.bool)
        start = 1 + lengths[0]
        scored[start : start + lengths[1]] = True
        start += lengths[1] + lengths[2]
        scored[start : start + lengths[3]] = True
        logits = self.model(input_ids=tokens[None]).logits[0]  # (T, V)
        logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, tokens[1:, None]).squeeze(1)  # (T-1,)
        return logp[scored[1:]].sum()


def _rms_norm_in_input_dtype(norm: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return norm.weight * (hidden * torch.rsqrt(variance + norm.variance_epsilon))


@functools.lru_cache(maxsize=4)
def qwen_policy(dtype: torch.dtype) -> QwenPolicy:
    """One model per dtype for the whole session (tests never change its weights)."""
    return QwenPolicy(dtype)


@dataclass(frozen=True)
class Batch:
    """Groups (id -> member ids, in order) and every trajectory's reward."""

    groups: Mapping[str, tuple[str, ...]]
    rewards: Mapping[str, float]

    @staticmethod
    def of(*group_rewards: Sequence[float], prefix: str = "") -> Batch:
        groups, rewards = {}, {}
        for g, rs in enumerate(group_rewards):
            members = tuple(f"{prefix}g{g}-t{i}" for i in range(len(rs)))
            groups[f"{prefix}g{g}"] = members
            rewards.update(zip(members, (float(r) for r in rs)))
        return Batch(groups, rewards)

    def group_of(self, trajectory_id: str) -> str:
        return next(g for g, members in self.groups.items() if trajectory_id in members)

    def events(self) -> list[tuple[str, str]]:
        """Every event of the batch, rewards of a group first then its logprobs."""
        out = []
        for members in self.groups.values():
            out += [("reward", t) for t in members] + [("logprob", t) for t in members]
        return out

    def without(self, *group_ids: str) -> Batch:
        groups = {g: m for g, m in self.groups.items() if g not in group_ids}
        return Batch(groups, {t: r for t, r in self.rewards.items() if self.group_of(t) in groups})


def grads_of(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Current .grad of each parameter; None reads as zeros."""
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]


def clear_grads(params: Iterable[torch.Tensor]) -> None:
    for p in params:
        p.grad = None


def reference_gradient(
    params: Sequence[torch.Tensor],
    batch: Batch,
    score: Score,
    estimator: str = "grpo",
    eps: float = 1e-6,
    num_groups: int | None = None,
) -> list[torch.Tensor]:
    """grad of L = -(1/N) sum_g sum_i A_i S_i by ONE backward over every trajectory's score."""
    n = len(batch.groups) if num_groups is None else num_groups
    terms = []
    for members in batch.groups.values():
        adv = advantages([batch.rewards[t] for t in members], estimator, eps)  # float64, (G,)
        terms += [float(a) * score(t) for a, t in zip(adv, members)]
    if not terms:
        return [torch.zeros_like(p) for p in params]
    loss = -torch.stack(terms).sum() / n
    grads = torch.autograd.grad(loss, list(params), allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def reference_objective(batch: Batch, score: Score, estimator: str = "grpo", eps: float = 1e-6) -> float:
    total = 0.0
    with torch.no_grad():
        for members in batch.groups.values():
            adv = advantages([batch.rewards[t] for t in members], estimator, eps)
            total += sum(float(a) * float(score(t)) for a, t in zip(adv, members))
    return total


def deliver(acc: StreamingGRPO, batch: Batch, score: Score, events: Iterable[tuple[str, str]]) -> None:
    """Send events in the given order; a group is opened just before its first event."""
    opened = set(acc.open_groups)
    for kind, tid in events:
        gid = batch.group_of(tid)
        if gid not in opened:
            acc.open_group(gid, batch.groups[gid])
            opened.add(gid)
        if kind == "reward":
            acc.add_reward(tid, batch.rewards[tid])
        else:
            acc.add_logprob(tid, score(tid))


def stream(
    params: Sequence[torch.Tensor],
    batch: Batch,
    score: Score,
    events: Iterable[tuple[str, str]] | None = None,
    num_groups: int | None = None,
    **kwargs,
) -> tuple[list[torch.Tensor], StreamingReport]:
    """Run one streamed step from cleared grads; return the resulting .grad and the report."""
    clear_grads(params)
    acc = StreamingGRPO(params, **kwargs)
    deliver(acc, batch, score, batch.events() if events is None else events)
    report = acc.finish(num_groups)
    return grads_of(params), report


def relative_error(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """max |got - want| / max |want| over every parameter (max |got| when want is all zero)."""
    diff = max(float((g.double() - w.double()).abs().max()) for g, w in zip(got, want))
    scale = max(float(w.double().abs().max()) for w in want)
    return diff if scale == 0.0 else diff / scale


TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}
