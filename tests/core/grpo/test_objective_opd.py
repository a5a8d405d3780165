"""On-policy distillation: the per-token reverse-KL term and the reward weight, against written references."""

from __future__ import annotations

import pytest
import torch

from thundersync_lightning.core import (
    ConfigError,
    InvalidLogprobError,
    Objective,
    Segment,
    StreamingGRPO,
    TokenScores,
    Trajectory,
    teacher_logprobs,
    trajectory_terms,
)

from ..objective_helpers import Batch, Event, TokenPolicy, barrier, params_of, rel, streamed, synchronous

BATCH = Batch(
    {"g0": ("a0", "a1", "a2"), "g1": ("b0", "b1"), "g2": ("c0",)},
    {"a0": 1.0, "a1": 0.0, "a2": 0.25, "b0": 1.0, "b1": 3.0, "c0": 1.0},
    {"a0": False, "a1": True, "a2": False, "b0": False, "b1": False, "c0": False},
)


def _written_opd_gradient(
    policy: TokenPolicy, coef: float, loss_agg: str, norm_tokens: float | None
) -> torch.Tensor:
    """grad of (coef/D) sum_i k_i sum_t (l_it - p_it) l_it, token by token (l - p a constant)."""
    params = params_of(policy)
    tids = BATCH.order
    scores = policy.scores(tids)
    teacher = policy.teacher(tids, scores)
    counts = scores.mask.sum(-1).double()
    d = {"group-sum": len(BATCH.groups), "token-mean": float(counts.sum())}.get(loss_agg, float(len(tids)))
    total = [torch.zeros_like(p) for p in params]
    for i in range(len(tids)):
        k = {
            "seq-mean-token-mean": 1.0 / float(counts[i]),
            "seq-mean-token-sum-norm": 1.0 / (norm_tokens or 1.0),
        }
        k_i = k.get(loss_agg, 1.0)
        for t in range(int(counts[i])):
            l_it = scores.logprobs[i, t]
            advantage = float(l_it.detach()) - float(teacher[i, t])  # (l - p): a number, no gradient
            grads = torch.autograd.grad(l_it, params, retain_graph=True)
            for acc, g in zip(total, grads):
                acc.add_(g, alpha=coef * k_i * advantage / d)
    return torch.cat([g.reshape(-1) for g in total])


@pytest.mark.parametrize(
    "loss_agg, norm_tokens",
    [
        ("group-sum", None),
        ("token-mean", None),
        ("seq-mean-token-mean", None),
        ("seq-mean-token-sum-norm", 4.0),
    ],
)
def test_opd_alone_is_the_written_per_token_reverse_kl_gradient_in_every_mode(loss_agg, norm_tokens):
    obj = Objective(opd_coef=0.7, reward_coef=0.0, loss_agg=loss_agg, norm_tokens=norm_tokens)
    policy = TokenPolicy(torch.float64, seed=3)
    expected = _written_opd_gradient(policy, 0.7, loss_agg, norm_tokens)
    assert float(expected.norm()) > 0
    assert rel(barrier(policy, obj, BATCH), expected) <= 1e-12
    assert rel(synchronous(policy, obj, BATCH), expected) <= 1e-12
    content_first = [Event("content", t) for t in BATCH.order]
    content_first += [Event("reward", t, BATCH.rewards[t], BATCH.failed[t]) for t in BATCH.order]
    assert rel(streamed(policy, obj, BATCH, content_first), expected) <= 1e-12


def test_opd_added_to_grpo_is_the_sum_of_the_two_gradients():
    policy = TokenPolicy(torch.float64, seed=4)
    both = barrier(policy, Objective(opd_coef=0.4, kl_coef=0.1), BATCH)
    grpo = barrier(policy, Objective(kl_coef=0.1), BATCH)
    opd = barrier(policy, Objective(opd_coef=0.4, reward_coef=0.0), BATCH)
    assert rel(both, grpo + opd) <= 1e-12
    half = barrier(policy, Objective(reward_coef=0.5), BATCH)
    assert rel(half, 0.5 * barrier(policy, Objective(), BATCH)) <= 1e-12


def test_the_opd_expectation_over_the_students_samples_is_the_gradient_of_kl_student_teacher():
    """sum_y pi(y) (l_y - p_y) grad l_y = grad KL(pi || q) at one position (the on-policy identity)."""
    torch.manual_seed(0)
    vocab = 5
    logits = torch.randn(vocab, dtype=torch.float64, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(vocab, dtype=torch.float64), -1)
    logp = torch.log_softmax(logits, -1)
    kl = (logp.exp() * (logp - teacher)).sum()
    (expected,) = torch.autograd.grad(kl, logits, retain_graph=True)
    obj = Objective(opd_coef=1.0, reward_coef=0.0)
    got = torch.zeros(vocab, dtype=torch.float64)
    for y in range(vocab):  # every possible sample y, weighted by the student's probability
        scores = TokenScores(logp[y].reshape(1, 1), torch.ones(1, 1, dtype=torch.bool))
        terms = trajectory_terms(obj, scores, None, teacher[y].reshape(1, 1))
        (g,) = torch.autograd.grad(-terms.regulariser.sum(), logits, retain_graph=True)  # L = -R
        got += float(logp[y].exp()) * g
    assert float((got - expected).norm()) <= 1e-12 * float(expected.norm())


def test_reward_coef_zero_skips_every_score_backward_and_opd_streams_on_arrival():
    policy = TokenPolicy(torch.float64, seed=5)
    events = [Event("content", t) for t in BATCH.order]  # every trajectory before any reward
    events += [Event("reward", t, BATCH.rewards[t], BATCH.failed[t]) for t in BATCH.order]
    for reward_coef, passes in ((0.0, 6), (1.0, 11)):
        acc = StreamingGRPO(params_of(policy), objective=Objective(opd_coef=0.5, reward_coef=reward_coef))
        for gid, ts in BATCH.groups.items():
            acc.open_group(gid, ts)
        for t in BATCH.order:
            s = policy.scores([t], entropy=False, reference=False)
            acc.add_tokens([t], s, None, teacher_logprobs=policy.teacher([t], s))
        for e in events[len(BATCH.order) :]:
            acc.add_reward(e.tid, e.reward, failed=e.failed)
        report = acc.finish()
        # R_i: one backward per trajectory; S_i: held apart (one each) except c0, a singleton (A = 0)
        assert report.backward_passes == passes, reward_coef
        for p in params_of(policy):
            p.grad = None


def _trajectory(tid: str, teacher: tuple[float, ...] | None) -> Trajectory:
    return Trajectory(
        trajectory_id=tid,
        group_id="g",
        sample=0,
        prompt=(1, 2),
        segments=(Segment((3, 4), True, (-0.1, -0.2), teacher), Segment((5,), False)),
        policy_version=0,
        num_turns=1,
        finish_reason="submit",
        submitted_at=0.0,
        content_ready_at=0.0,
    )


def test_teacher_logprobs_are_laid_out_like_the_mask_and_a_missing_one_names_its_trajectory():
    mask = torch.tensor([[False, True, True, False], [False, True, True, False]])
    good = [_trajectory("t0", (-1.0, -2.0)), _trajectory("t1", (-3.0, -4.0))]
    out = teacher_logprobs(good, mask, torch.float64)
    assert out.tolist() == [[0.0, -1.0, -2.0, 0.0], [0.0, -3.0, -4.0, 0.0]]
    with pytest.raises(InvalidLogprobError, match=r"trajectory 't9' has no teacher logprobs.*TeacherConfig"):
        teacher_logprobs([good[0], _trajectory("t9", None)], mask, torch.float64)
    with pytest.raises(
        InvalidLogprobError, match=r"trajectory 't0' has 2 teacher logprobs for 1 scored positions"
    ):
        teacher_logprobs(good[:1], mask[:1] & torch.tensor([True, True, False, False]), torch.float64)
    with pytest.raises(ValueError, match="2 tokens but 1 teacher_logprobs"):
        Segment((3, 4), True, None, (-1.0,))


def test_opd_without_teacher_logprobs_is_refused_by_the_terms():
    scores = TokenScores(torch.zeros(1, 2, requires_grad=True), torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(InvalidLogprobError, match="opd_coef=0.5 needs the teacher's logprobs"):
        trajectory_terms(Objective(opd_coef=0.5), scores, None)


def test_opd_and_reward_weights_are_validated_and_opd_needs_a_teacher():
    with pytest.raises(ConfigError, match="opd_coef must be a finite number >= 0, got inf"):
        Objective(opd_coef=float("inf"))
    assert Objective(opd_coef=0.1).needs_teacher and not Objective().needs_teacher
    assert Objective(opd_coef=0.1).has_regulariser_terms and Objective(opd_coef=0.1).needs_token_detail
    assert Objective(reward_coef=0.0).coefficients(torch.tensor([0.0, 1.0], dtype=torch.float64)) == (
        0.0,
        0.0,
    )
