"""The boundary cut: a group's prompt run forward and backward once gives the uncut gradient."""

from __future__ import annotations

import functools
import random

import pytest
import torch

from thundersync_lightning.core import ConfigError, Objective, StreamingGRPO, engine_logprobs
from thundersync_lightning.core.types import Segment, Trajectory
from thundersync_lightning.modules import GRPOPolicy, LoraSettings

from ..helpers import _rms_norm_in_input_dtype

CONFIG = {
    "vocab_size": 24,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}


def _policy(dtype: str, objective: Objective, lora: bool = False) -> GRPOPolicy:
    torch.manual_seed(0)
    config = dict(CONFIG, attn_implementation="sdpa" if dtype == "float64" else "eager")
    policy = GRPOPolicy(
        config=config, dtype=dtype, objective=objective, lora=LoraSettings(r=4) if lora else None
    )
    policy.eval()  # no dropout: the two passes must see the same function
    if dtype == "float64":
        for module in policy.modules():
            if type(module).__name__ == "Qwen3RMSNorm":
                module.forward = functools.partial(_rms_norm_in_input_dtype, module)
    return policy


def _group(gid: str, size: int, seed: int) -> tuple[list[Trajectory], dict[str, float]]:
    """Members share a 14-token prompt, then two scored actions around an unscored observation."""
    rng = random.Random(seed)
    prompt = tuple(rng.randrange(24) for _ in range(14))
    out, rewards = [], {}
    for k in range(size):
        segs = []
        for kind in (True, False, True):
            tokens = tuple(rng.randrange(24) for _ in range(rng.randint(1, 4)))
            logprobs = tuple(-rng.random() * 3 for _ in tokens) if kind else None
            segs.append(Segment(tokens, kind, logprobs))
        tid = f"{gid}-t{k}"
        out.append(Trajectory(tid, gid, k, prompt, tuple(segs), 0, 2, "submit", 0.0, 0.0))
        rewards[tid] = rng.choice([0.0, 1.0, 0.5])
    return out, rewards


def _gradient(
    policy: GRPOPolicy, groups, rewards, cut: bool, seed: int, filter_groups: bool = False, kinds=None
) -> torch.Tensor:
    """``kinds``: trajectory id -> "failed" (scored at the floor) or "unscorable"."""
    kinds = kinds or {}
    obj = policy.objective
    params = [p for p in policy.parameters() if p.requires_grad]
    acc = StreamingGRPO(params, objective=obj, filter_groups=filter_groups)
    events = []
    for gid, members in groups.items():
        acc.open_group(gid, [t.trajectory_id for t in members])
        events += [("reward", t) for t in members] + [("content", t) for t in members]
    random.Random(seed).shuffle(events)
    prefixes = {}
    for kind, t in events:
        if kind == "reward":
            kind = kinds.get(t.trajectory_id)
            acc.add_reward(
                t.trajectory_id, rewards[t.trajectory_id], kind == "failed", unscorable=kind == "unscorable"
            )
            continue
        prefix = None
        if cut:
            prefix = prefixes.get(t.group_id) or prefixes.setdefault(
                t.group_id, policy.encode_prefix(t.prompt)
            )
        extra = {"prefix": prefix} if cut else {}
        scores = policy.score_tokens([t], entropy=obj.needs_entropy, reference=obj.needs_reference, **extra)
        acc.add_tokens(
            [t.trajectory_id], scores, engine_logprobs([t], scores.mask, scores.logprobs.dtype), prefix=prefix
        )
    report = acc.finish()
    assert report.backward_passes > 0
    out = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    return out


OBJECTIVES = [
    Objective(),
    Objective(
        estimator="rloo",
        loss_agg="token-mean",
        kl_coef=0.1,
        entropy_coef=0.05,
        is_correction="token_truncate",
    ),
    Objective(scale="batch", std="sample", kl_coef=0.1, failed="drop", loss_agg="seq-mean-token-mean"),
]


@pytest.mark.parametrize("objective", OBJECTIVES, ids=["default", "rloo-kl-entropy-is", "batch-kl"])
def test_the_cut_gradient_equals_the_uncut_one_in_fp64(objective):
    policy = _policy("float64", objective)
    groups, rewards = {}, {}
    for g in range(3):
        members, r = _group(f"g{g}", 4, seed=g)
        groups[f"g{g}"], rewards = members, {**rewards, **r}
    uncut = _gradient(policy, groups, rewards, cut=False, seed=1)
    for seed in (2,):
        cut = _gradient(policy, groups, rewards, cut=True, seed=seed)
        assert float((cut - uncut).norm() / uncut.norm()) <= 1e-10


def test_floored_failures_and_unscorable_members_fold_the_same_with_the_cut():
    policy = _policy("float64", Objective(kl_coef=0.1))  # R terms reach the prompt's leaves too
    groups, rewards = {}, {}
    for g in range(2):
        members, r = _group(f"g{g}", 4, seed=g)
        groups[f"g{g}"], rewards = members, {**rewards, **r}
    kinds = {groups["g0"][0].trajectory_id: "failed", groups["g0"][1].trajectory_id: "unscorable",
             groups["g1"][2].trajectory_id: "failed"}  # fmt: skip
    uncut = _gradient(policy, groups, rewards, cut=False, seed=1, kinds=kinds)
    cut = _gradient(policy, groups, rewards, cut=True, seed=5, kinds=kinds)
    assert float((cut - uncut).norm() / uncut.norm()) <= 1e-10


def test_dynamic_sampling_drops_a_filtered_groups_prompt_leaves_with_the_cut():
    policy = _policy("float64", OBJECTIVES[1])  # KL and entropy: R terms reach the prompt's leaves too
    groups, rewards = {}, {}
    for g in range(3):
        members, r = _group(f"g{g}", 4, seed=g)
        groups[f"g{g}"], rewards = members, {**rewards, **r}
    rewards.update({t.trajectory_id: 1.0 for t in groups["g1"]})  # g1 carries no signal
    kept = {g: m for g, m in groups.items() if g != "g1"}
    expected = _gradient(policy, kept, rewards, cut=False, seed=1)
    for cut in (False, True):
        got = _gradient(policy, groups, rewards, cut=cut, seed=3, filter_groups=True)
        assert float((got - expected).norm() / expected.norm()) <= 1e-10


def test_the_cut_gradient_equals_the_uncut_one_in_fp32_with_lora():
    policy = _policy("float32", OBJECTIVES[1], lora=True)
    groups, rewards = {}, {}
    for g in range(2):
        members, r = _group(f"g{g}", 3, seed=10 + g)
        groups[f"g{g}"], rewards = members, {**rewards, **r}
    uncut = _gradient(policy, groups, rewards, cut=False, seed=1)
    cut = _gradient(policy, groups, rewards, cut=True, seed=4)
    assert float((cut - uncut).norm() / uncut.norm()) <= 1e-5


def test_the_cut_refuses_trajectories_that_do_not_continue_the_prefix():
    policy = _policy("float32", Objective())
    members, _ = _group("g0", 2, seed=0)
    other, _ = _group("g1", 1, seed=5)
    prefix = policy.encode_prefix(members[0].prompt)
    with pytest.raises(ConfigError, match="do not continue the group's shared prefix"):
        policy.score_tokens([members[0], other[0]], prefix=prefix)
