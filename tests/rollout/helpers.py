"""Test helpers: collect events, and the learner-side logprobs of a trajectory."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import torch

from thundersync_lightning.rollout import ContentReady, RewardReady, RolloutEvent, Trajectory


def collect(
    events: Iterable[RolloutEvent],
) -> tuple[dict[str, Trajectory], dict[str, RewardReady], list[RolloutEvent]]:
    """(trajectories by id, rewards by id, all events in arrival order)."""
    trajectories: dict[str, Trajectory] = {}
    rewards: dict[str, RewardReady] = {}
    order: list[RolloutEvent] = []
    for ev in events:
        order.append(ev)
        if isinstance(ev, ContentReady):
            assert ev.trajectory.trajectory_id not in trajectories, "ContentReady delivered twice"
            trajectories[ev.trajectory.trajectory_id] = ev.trajectory
        else:
            assert ev.trajectory_id not in rewards, "RewardReady delivered twice"
            rewards[ev.trajectory_id] = ev
    return trajectories, rewards, order


@torch.no_grad()
def learner_logprobs(
    model: torch.nn.Module, traj: Trajectory, temperature: float = 1.0, top_p: float = 1.0
) -> torch.Tensor:
    """log_softmax(logits / T) of every scored token, from one unpadded forward of the whole episode;
    with ``top_p < 1`` under the nucleus-truncated, renormalised distribution (what was sampled)."""
    tokens = torch.tensor([traj.tokens])  # (1, L)
    logits = model(input_ids=tokens).logits[0, :-1].float()  # (L-1, V)
    logp = torch.log_softmax(logits / temperature, dim=-1)  # (L-1, V)
    lp = logp.gather(-1, tokens[0, 1:, None]).squeeze(-1)  # (L-1,)
    if top_p < 1.0:
        probs, _ = torch.sort(logp.exp(), dim=-1, descending=True, stable=True)
        kept = torch.where(torch.cumsum(probs, -1) - probs < top_p, probs, torch.zeros_like(probs)).sum(-1)
        lp = lp - torch.log(kept)
    scored = torch.tensor(traj.scored_mask[1:])
    return lp[scored]


def assert_same_outcomes(a: Iterable[RolloutEvent], b: Iterable[RolloutEvent], atol: float = 1e-5) -> None:
    """The two event streams carry the same trajectories (tokens, turns, finish reasons, failures)
    and rewards; times may differ, and logprobs by float rounding (batch composition moves them,
    never the tokens)."""
    (ta, ra, _), (tb, rb, _) = collect(a), collect(b)
    assert set(ta) == set(tb) and set(ra) == set(rb)

    def bare(traj: Trajectory) -> Trajectory:
        segments = tuple(replace(s, logprobs=None) for s in traj.segments)
        return replace(traj, submitted_at=0.0, content_ready_at=0.0, segments=segments)

    for tid in ta:
        assert bare(ta[tid]) == bare(tb[tid]), tid
        assert (ra[tid].reward, ra[tid].failure) == (rb[tid].reward, rb[tid].failure), tid
        gap = torch.tensor(ta[tid].sampling_logprobs) - torch.tensor(tb[tid].sampling_logprobs)
        assert gap.numel() == 0 or gap.abs().max().item() <= atol, tid
