"""GRPOPolicy: scores of scored tokens only, at the sampling temperature; LoRA merged for engines."""

from __future__ import annotations

import pytest
import torch

from thundersync_lightning.core import EngineSampling
from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.core.types import Segment, Trajectory
from thundersync_lightning.modules import GRPOPolicy, LoraSettings
from thundersync_lightning.modules.micro_batches import micro_batches

from ..strategy._fit import TOY_MODEL


def _trajectory(prompt, segments, tid="s0-g0-t0"):
    return Trajectory(tid, "s0-g0", 0, tuple(prompt), tuple(segments), 0, 1, "submit", 0.0, 0.0)


def _manual_score(policy, trajectory, temperature=1.0):
    ids = torch.tensor([trajectory.tokens])
    logits = policy.model(input_ids=ids).logits[0].double() / temperature
    logprobs = torch.log_softmax(logits, -1)
    mask = trajectory.scored_mask
    return sum(float(logprobs[t - 1, ids[0, t]]) for t in range(1, ids.shape[1]) if mask[t])


def test_the_score_sums_the_logprobs_of_scored_tokens_only():
    torch.manual_seed(0)
    policy = GRPOPolicy(config=TOY_MODEL)
    t = _trajectory([14, 1], [Segment((3, 4), True), Segment((10,), False), Segment((5,), True)])
    got = float(policy.trajectory_logprobs([t])[0])
    assert abs(got - _manual_score(policy, t)) < 1e-5


def test_a_trajectory_that_failed_before_its_prompt_scores_zero_alone_or_beside_others():
    torch.manual_seed(0)
    policy = GRPOPolicy(config=TOY_MODEL)
    empty = _trajectory([], [], tid="s0-g0-t1")  # a row that could not be scored: no token at all
    t = _trajectory([14, 1], [Segment((3, 4), True)])
    alone = policy.score_tokens([empty, empty])
    assert not alone.mask.any() and alone.logprobs.requires_grad
    both = policy.trajectory_logprobs([t, empty])
    assert float(both[1]) == 0.0 and abs(float(both[0]) - _manual_score(policy, t)) < 1e-5


def test_the_score_uses_the_sampling_temperature():
    torch.manual_seed(0)
    policy = GRPOPolicy(config=TOY_MODEL, temperature=0.7)
    t = _trajectory([14], [Segment((3, 4, 5), True)])
    assert abs(float(policy.trajectory_logprobs([t])[0]) - _manual_score(policy, t, 0.7)) < 1e-5


def test_the_score_uses_the_engines_sampling_temperature_unless_the_policy_names_one():
    torch.manual_seed(0)
    policy = GRPOPolicy(config=TOY_MODEL)
    t = _trajectory([14], [Segment((3, 4, 5), True)])
    assert policy.temperature == 1.0  # no engine seen yet
    policy.use_engine_sampling(EngineSampling(temperature=0.7))
    assert abs(float(policy.trajectory_logprobs([t])[0]) - _manual_score(policy, t, 0.7)) < 1e-5
    named = GRPOPolicy(config=TOY_MODEL, temperature=1.3)
    named.use_engine_sampling(EngineSampling(temperature=0.7))
    assert named.temperature == 1.3  # set-up refuses or warns about the pair (strategy/objective_checks.py)


def test_padding_in_a_batch_does_not_change_any_score():
    torch.manual_seed(0)
    policy = GRPOPolicy(config=TOY_MODEL)
    short = _trajectory([14], [Segment((3,), True)], "a")
    long = _trajectory([14, 2, 2], [Segment((3, 4, 5, 6), True)], "b")
    batched = policy.trajectory_logprobs([short, long])
    alone = torch.stack([policy.trajectory_logprobs([short])[0], policy.trajectory_logprobs([long])[0]])
    assert torch.allclose(batched, alone, atol=1e-5)


def test_a_right_padded_forward_gives_every_real_token_the_scores_of_its_row_alone():
    # one forward for all rows (no micro-batch cut), no padding mask: per-token logprobs, entropies
    # and the reference's logprobs of each row equal its own unpadded forward's
    torch.manual_seed(0)
    policy = GRPOPolicy(
        config=TOY_MODEL, score_max_padding=float("inf"), objective={"kl_coef": 0.1, "entropy_coef": 0.01}
    )
    rows = [_trajectory([14], [Segment((3,), True)], "a"),
            _trajectory([14, 2, 2, 7], [Segment((3, 4, 5, 6, 1, 2), True)], "b"),
            _trajectory([14, 2], [Segment((9, 9), True), Segment((10,), False), Segment((4,), True)],
                        "c")]  # fmt: skip
    batched = policy.score_tokens(rows, entropy=True, reference=True)
    for i, t in enumerate(rows):
        alone = policy.score_tokens([t], entropy=True, reference=True)
        width = alone.mask.shape[1]
        assert torch.equal(batched.mask[i, :width], alone.mask[0]) and not batched.mask[i, width:].any()
        real = alone.mask[0]
        for got, want in ((batched.logprobs, alone.logprobs), (batched.entropy, alone.entropy),
                          (batched.ref_logprobs, alone.ref_logprobs)):  # fmt: skip
            assert torch.allclose(got[i, :width][real], want[0][real], atol=1e-5)


def test_the_old_token_weighting_option_says_where_it_moved():
    import pytest

    from thundersync_lightning.core import ConfigError

    with pytest.raises(ConfigError, match="token_weighting='mean': it moved to objective.loss_agg"):
        GRPOPolicy(config=TOY_MODEL, token_weighting="mean")
    with pytest.raises(ConfigError, match="estimator='rloo': it moved to objective.estimator"):
        GRPOPolicy(config=TOY_MODEL, estimator="rloo")


def test_lora_trains_only_adapters_and_publishes_merged_weights_under_base_names():
    torch.manual_seed(0)
    plain = GRPOPolicy(config=TOY_MODEL)
    policy = GRPOPolicy(config=TOY_MODEL, lora=LoraSettings(r=2, alpha=4))
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():  # make the adapters non-zero so the merge is visible
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.fill_(0.01)
    weights = policy.weights_for_engine()
    assert set(weights) == set(plain.model.state_dict())
    layer = policy.model.get_base_model().model.layers[0].self_attn.q_proj
    expected = layer.base_layer.weight + layer.get_delta_weight("default")
    assert torch.allclose(weights["model.layers.0.self_attn.q_proj.weight"], expected)
    assert not torch.allclose(expected, layer.base_layer.weight)


def test_weights_for_engine_share_storage_with_the_parameters_without_lora():
    policy = GRPOPolicy(config=TOY_MODEL)
    weights = policy.weights_for_engine()
    param = dict(policy.model.named_parameters())["model.layers.0.mlp.up_proj.weight"]
    assert weights["model.layers.0.mlp.up_proj.weight"].data_ptr() == param.data_ptr()


def test_a_lora_policy_streams_with_zero_staleness_and_moves_only_adapters():
    from ..strategy._fit import fit

    policy = GRPOPolicy(config=TOY_MODEL, lora=LoraSettings(r=2, alpha=4))
    base_before = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    lora_before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    _, steps, _ = fit("streaming", steps=2, policy=policy)
    assert [s.staleness_max for s in steps] == [0, 0]
    after = dict(policy.named_parameters())
    assert all(torch.equal(after[n], v) for n, v in base_before.items())
    assert any(not torch.equal(after[n], v) for n, v in lora_before.items())


def test_length_sorted_micro_batches_give_the_scores_of_one_batch_in_the_original_order():
    torch.manual_seed(0)
    whole = GRPOPolicy(config=TOY_MODEL, score_batch_tokens=10_000)
    split = GRPOPolicy(config=TOY_MODEL, score_batch_tokens=8)  # at most one or two rows a forward
    split.load_state_dict(whole.state_dict())
    trajectories = [
        _trajectory([14] * (1 + k % 3), [Segment(tuple(range(1, 2 + k)), True)], f"t{k}")
        for k in (4, 0, 2, 5, 1, 3)
    ]
    assert torch.allclose(
        split.trajectory_logprobs(trajectories), whole.trajectory_logprobs(trajectories), atol=1e-5
    )


@pytest.mark.parametrize("max_padding", [0.0, 0.25, float("inf")])
def test_micro_batches_bound_padding_and_budget_and_keep_every_row_once(max_padding):
    lengths = [70, 12, 250, 64, 66, 13, 900, 11, 240, 68]
    chunks = micro_batches(lengths, budget_tokens=600, max_padding=max_padding)
    assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
    for chunk in chunks:
        ls = [lengths[i] for i in chunk]
        assert ls == sorted(ls)
        padded = len(ls) * max(ls)
        assert len(ls) == 1 or (padded <= 600 and padded <= (1 + max_padding) * sum(ls))
    if max_padding == 0.0:  # only equal lengths may share a forward
        assert all(len({lengths[i] for i in c}) == 1 for c in chunks)
    if max_padding == float("inf"):  # the budget alone cuts: 11, 12, 13 and 64, 66, 68, 70 share
        assert [lengths[i] for i in chunks[0]] == [11, 12, 13, 64, 66, 68, 70]


def test_score_max_padding_changes_forwards_not_scores():
    torch.manual_seed(0)
    loose = GRPOPolicy(config=TOY_MODEL, score_max_padding=float("inf"))
    tight = GRPOPolicy(config=TOY_MODEL, score_max_padding=0.0, score_forward_tokens=0)
    tight.load_state_dict(loose.state_dict())
    trajectories = [
        _trajectory([14] * 2, [Segment(tuple(1 + j % 9 for j in range(1 + 3 * k)), True)], f"t{k}")
        for k in (4, 0, 2, 5, 1, 3)
    ]
    calls = []
    tight.model.register_forward_hook(lambda *_: calls.append(1))
    assert torch.allclose(
        tight.trajectory_logprobs(trajectories), loose.trajectory_logprobs(trajectories), atol=1e-5
    )
    assert len(calls) == 6  # six distinct lengths: six forwards
    with pytest.raises(ConfigError, match="score_max_padding"):
        GRPOPolicy(config=TOY_MODEL, score_max_padding=-1.0)


def test_a_forwards_fixed_cost_lets_short_rows_share_a_forward_that_padding_alone_would_cut():
    lengths = [3, 5, 7, 9, 9, 300, 330]
    # padding alone (0.25): 3 5 (10 <= 1.25 x 8) | 7 9 9 (7 with 3 5 would be 21 > 1.25 x 15) | 300 330
    assert micro_batches(lengths, budget_tokens=8192, max_padding=0.25) == [[0, 1], [2, 3, 4], [5, 6]]
    # 3, 5, 7, 9, 9 padded to 9 is 45 tokens for 33 real: 12 padded, under one forward's 16
    assert micro_batches(lengths, 8192, 0.25, overhead_tokens=16) == [[0, 1, 2, 3, 4], [5, 6]]
    # no padding share, 6 tokens a forward: 3 5 7 padded to 7 wastes 6; a 9 would waste 12: cut;
    # 300 330 would waste 30: two forwards
    assert micro_batches(lengths, 8192, 0.0, overhead_tokens=6) == [[0, 1, 2], [3, 4], [5], [6]]
    for overhead in (0, 6, 16, 64, 10_000):
        for max_padding in (0.0, 0.25):
            chunks = micro_batches(lengths, 600, max_padding, overhead_tokens=overhead)
            assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
            for chunk in chunks:
                ls = [lengths[i] for i in chunk]
                padded = len(ls) * max(ls)
                assert len(ls) == 1 or padded <= min(
                    600, max((1 + max_padding) * sum(ls), sum(ls) + overhead)
                )


@pytest.mark.parametrize("forward_tokens", [0, 64, 10_000])
def test_score_forward_tokens_changes_forwards_not_scores(forward_tokens):
    torch.manual_seed(0)
    reference = GRPOPolicy(config=TOY_MODEL, score_max_padding=0.0, score_forward_tokens=0)
    policy = GRPOPolicy(config=TOY_MODEL, score_max_padding=0.0, score_forward_tokens=forward_tokens)
    policy.load_state_dict(reference.state_dict())
    trajectories = [
        _trajectory([14] * 2, [Segment(tuple(1 + j % 9 for j in range(1 + 3 * k)), True)], f"t{k}")
        for k in (4, 0, 2, 5, 1, 3)
    ]  # 3, 6, ..., 18 tokens
    calls = []
    policy.model.register_forward_hook(lambda *_: calls.append(1))
    assert torch.allclose(
        policy.trajectory_logprobs(trajectories), reference.trajectory_logprobs(trajectories), atol=1e-5
    )
    # 0: one forward per length; 64: 3..18 padded to 18 is 108 for 63 real (45 padded <= 64); 10k: one
    assert len(calls) == {0: 6, 64: 1, 10_000: 1}[forward_tokens]
    with pytest.raises(ConfigError, match="score_forward_tokens"):
        GRPOPolicy(config=TOY_MODEL, score_forward_tokens=-1)


def test_a_missing_or_wrong_pretrained_path_is_one_config_error_saying_what_is_there(tmp_path):
    with pytest.raises(ConfigError, match=r"pretrained_path 'models/none \(from .*\)' does not exist"):
        GRPOPolicy(pretrained_path="models/none")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match="is a file"):
        GRPOPolicy(pretrained_path=str(tmp_path / "weights.bin"))
    with pytest.raises(ConfigError, match="has no config.json"):
        GRPOPolicy(pretrained_path=str(tmp_path))
