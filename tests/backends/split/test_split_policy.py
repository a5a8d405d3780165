"""The split backward on the real policy: one backward for a batch spanning every destination
gives the per-destination gradients of every objective option (transformers Qwen3, LoRA too)."""

from __future__ import annotations

import pytest
import torch

from thundersync_lightning.backends.split import SplitBackend
from thundersync_lightning.core import Objective, Segment, StreamingGRPO, Trajectory
from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.core.grpo.terms import engine_logprobs, teacher_logprobs
from thundersync_lightning.modules import GRPOPolicy, LoraSettings

from ...strategy._fit import TOY_MODEL

G, SIZE = 4, 4
OBJECTIVES = {
    "default": Objective(),
    "rloo-token-mean-kl-entropy": Objective(
        estimator="rloo", loss_agg="token-mean", kl_coef=0.1, entropy_coef=0.01, singleton="reward"
    ),
    "trl-batch-drop-kl": Objective.preset(
        "trl", scale="batch", failed="drop", kl_coef=0.05, kl_estimator="k2"
    ),
    "verl": Objective.preset("verl"),
    "is-token-truncate": Objective(is_correction="token_truncate", is_cap=2.0),
    "opd": Objective(opd_coef=0.5),
}


def _trajectory(g: int, i: int) -> Trajectory:
    gen = torch.Generator().manual_seed(100 * g + i)
    vocab = TOY_MODEL["vocab_size"]
    n = 2 + int(torch.randint(0, 6, (), generator=gen))  # different lengths: padding in every micro-batch
    tokens = tuple(int(x) for x in torch.randint(0, vocab, (n,), generator=gen))
    engine = tuple(float(x) for x in -torch.rand(n, generator=gen) * 3)
    teacher = tuple(float(x) for x in -torch.rand(n, generator=gen) * 3)
    prompt = tuple(int(x) for x in torch.randint(0, vocab, (3,), generator=gen))
    return Trajectory(
        f"t{g}-{i}", f"g{g}", 0, prompt, (Segment(tokens, True, engine, teacher),), 0, 1, "stop", 0.0, 0.0
    )


REWARDS = {f"t{g}-{i}": float((g + i) % 2) for g in range(G) for i in range(SIZE)}
FAILED = {"t3-1"}  # its verdict fails: dropped under failed="drop"


EARLY = [
    "t0-0",
    "t0-1",
    "t0-2",
    "t0-3",
    "t1-0",
    "t1-1",
    "t2-0",
]  # group 0 complete (direct), 1-2 partly (buckets)


def _before(acc: StreamingGRPO) -> None:
    for g in range(G):
        acc.open_group(f"g{g}", [f"t{g}-{i}" for i in range(SIZE)])
    for tid in EARLY:
        acc.add_reward(tid, REWARDS[tid])


def _after(acc: StreamingGRPO) -> None:
    for tid, r in REWARDS.items():
        if tid not in EARLY:  # group 3's rewards were pending: its gradients were held
            acc.add_reward(tid, r, failed=tid in FAILED)


def _step(policy: GRPOPolicy, objective: Objective, backend: SplitBackend | None) -> tuple[torch.Tensor, int]:
    params = [p for p in policy.parameters() if p.requires_grad]
    acc = StreamingGRPO(params, objective=objective, backend=backend)
    _before(acc)
    batch = [_trajectory(g, i) for g in range(G) for i in range(SIZE)]
    watch = backend.watch(G * SIZE) if backend is not None else None
    scores = policy.score_tokens(
        batch, entropy=objective.needs_entropy, reference=objective.needs_reference, watch=watch
    )
    engine = engine_logprobs(batch, scores.mask, scores.logprobs.dtype)
    teacher = teacher_logprobs(batch, scores.mask, scores.logprobs.dtype) if objective.needs_teacher else None
    acc.add_tokens([t.trajectory_id for t in batch], scores, engine, teacher_logprobs=teacher, watch=watch)
    _after(acc)
    for p in params:
        p.grad = None
    report = acc.finish()
    return torch.cat([p.grad.reshape(-1) for p in params]).clone(), report.backward_passes


def _policy(objective: Objective, **kwargs) -> GRPOPolicy:
    torch.manual_seed(0)
    policy = GRPOPolicy(config=TOY_MODEL, objective=objective, **{"score_batch_tokens": 40, **kwargs})
    with torch.no_grad():  # a trained-looking model: LoRA's B starts at zero, so no gradient would pass it
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    return policy


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_one_split_backward_gives_every_destinations_gradient(name):
    objective = OBJECTIVES[name]
    policy = _policy(objective)
    reference, jobs = _step(policy, objective, None)
    backend = SplitBackend(policy, [p for p in policy.parameters() if p.requires_grad])
    split, passes = _step(policy, objective, backend)
    assert backend.verified and backend.refused is None
    assert float(reference.norm()) > 0
    assert float((split - reference).norm() / reference.norm()) <= 1e-5
    # one pass; two where rows feed two places: S_i to a sum or held, R_i (KL, entropy, OPD) elsewhere
    has_r = bool(objective.kl_coef or objective.entropy_coef or objective.opd_coef)
    assert passes == (2 if has_r else 1)
    assert jobs >= 8 > passes
    again, _ = _step(policy, objective, backend)  # verified: no per-job check any more
    assert float((again - reference).norm() / reference.norm()) <= 1e-5


@pytest.mark.parametrize("forward_tokens", [0, 64, 10_000])
def test_the_micro_batch_cut_changes_the_split_calls_forwards_never_its_gradient(forward_tokens):
    objective = Objective()
    reference, _ = _step(_policy(objective, score_forward_tokens=0), objective, None)
    policy = _policy(objective, score_forward_tokens=forward_tokens, score_batch_tokens=8192)
    backend = SplitBackend(policy, [p for p in policy.parameters() if p.requires_grad], strict=True)
    forwards = []
    policy.model.register_forward_hook(lambda *_: forwards.append(1))
    split, passes = _step(policy, objective, backend)
    assert backend.verified and passes == 1
    # 16 rows of 5-10 tokens: cut by the padding share alone into 5-8 | 9-10, else padded into one
    assert len(forwards) == (2 if forward_tokens == 0 else 1)
    assert float((split - reference).norm() / reference.norm()) <= 1e-5


def test_lora_adapters_split_exactly_with_the_base_frozen():
    objective = OBJECTIVES["rloo-token-mean-kl-entropy"]
    policy = _policy(objective, lora=LoraSettings(r=2, target_modules=("q_proj", "v_proj", "down_proj")))
    params = [p for p in policy.parameters() if p.requires_grad]
    assert 0 < len(params) < len(list(policy.parameters()))
    reference, _ = _step(policy, objective, None)
    backend = SplitBackend(policy, params)
    split, passes = _step(policy, objective, backend)
    assert passes == 2 and backend.verified  # KL and entropy: R_i of held rows go elsewhere
    assert float((split - reference).norm() / reference.norm()) <= 1e-5


def test_the_capture_records_only_grad_forwards_and_is_refused_for_a_prefix():
    objective = OBJECTIVES["rloo-token-mean-kl-entropy"]  # KL: a no-grad reference forward
    policy = _policy(objective)
    params = [p for p in policy.parameters() if p.requires_grad]
    backend = SplitBackend(policy, params)
    capture = backend.capture
    batch = [_trajectory(0, i) for i in range(3)]
    policy.score_tokens(batch, reference=True, watch=capture)
    assert capture.records and all(r.output.requires_grad for r in capture.records)
    assert not capture.recording
    acc = StreamingGRPO(params, objective=Objective(), backend=backend)
    acc.open_group("g0", ["t0-0"])
    prefix = policy.encode_prefix(batch[0].prompt)
    scores = policy.score_tokens(batch[:1], prefix=prefix, watch=capture)
    with pytest.raises(ConfigError, match="shared prefix"):
        acc.add_tokens(["t0-0"], scores, prefix=prefix, watch=capture)
    assert acc.held_trajectories == 0 and not capture.records  # refused before any change


def test_bf16_weights_split_within_bf16_rounding_of_the_per_destination_passes():
    objective = OBJECTIVES["default"]
    policy = _policy(objective, dtype="bfloat16")
    params = [p for p in policy.parameters() if p.requires_grad]
    assert {p.dtype for p in params} == {torch.bfloat16}
    reference, _ = _step(policy, objective, None)
    backend = SplitBackend(policy, params)
    split, passes = _step(policy, objective, backend)
    assert passes == 1 and backend.verified  # the first-use check passed at bf16's tolerance
    assert float((split.double() - reference.double()).norm() / reference.double().norm()) <= 3e-2


def test_rows_dropped_after_their_group_closed_feed_nothing_in_a_split_call():
    """failed="drop": a member whose failed verdict closed its group before its content was scored
    is left out of the terms (a late row); the recorded forward still has it, at its batch row."""
    objective = OBJECTIVES["trl-batch-drop-kl"]
    policy = _policy(objective)
    params = [p for p in policy.parameters() if p.requires_grad]

    def step(backend: SplitBackend | None) -> torch.Tensor:
        acc = StreamingGRPO(params, objective=objective, backend=backend)
        capture = backend.capture if backend is not None else None
        _before(acc)
        acc.open_group("g9", ["t9-0", "t9-1"])
        late, kept = _trajectory(9, 0), _trajectory(9, 1)
        acc.add_reward("t9-0", 0.0, failed=True)
        acc.add_reward("t9-1", 1.0)
        s = policy.score_tokens([kept], reference=True)
        acc.add_tokens(["t9-1"], s, engine_logprobs([kept], s.mask, s.logprobs.dtype))  # g9 closes
        batch = [_trajectory(g, i) for g in range(G) for i in range(SIZE)]
        batch.insert(5, late)
        scores = policy.score_tokens(batch, entropy=objective.needs_entropy, reference=True, watch=capture)
        engine = engine_logprobs(batch, scores.mask, scores.logprobs.dtype)
        acc.add_tokens([t.trajectory_id for t in batch], scores, engine, watch=capture)
        _after(acc)
        for p in params:
            p.grad = None
        acc.finish()
        return torch.cat([p.grad.reshape(-1) for p in params]).clone()

    reference = step(None)
    backend = SplitBackend(policy, params)
    assert float((step(backend) - reference).norm() / reference.norm()) <= 1e-5
    assert backend.verified
