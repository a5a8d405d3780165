"""The advantage-estimator registry and the reference advantages A_i = a_g r_i + b_g."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from thundersync_lightning.core import (
    EstimatorName,
    Objective,
    StreamingGRPO,
    advantages,
    available_estimators,
    get_estimator,
    register_estimator,
)

from ..helpers import Batch, MLPPolicy, reference_gradient, relative_error, stream

# Rewards on a 1e-3 grid in [-10, 10]: sigma never underflows, so the definitions stay well-defined.
rewards_lists = st.lists(st.integers(-10_000, 10_000).map(lambda k: k / 1000), min_size=2, max_size=16)


def test_grpo_advantages_use_the_population_std_and_eps():
    # r = [0, 1]: mu = 0.5, population sigma = 0.5 (the sample std would be 0.707).
    got = advantages([0.0, 1.0], "grpo", eps=1e-6)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx([-0.5 / 0.500001, 0.5 / 0.500001], rel=1e-15)


def test_drgrpo_advantages_subtract_the_mean_only():
    assert advantages([1.0, 2.0, 6.0], "drgrpo").tolist() == pytest.approx([-2.0, -1.0, 3.0], rel=1e-15)


def test_rloo_advantages_subtract_the_mean_of_the_others():
    # r = [1, 2, 3, 6]: A_0 = 1 - (2+3+6)/3 = -8/3, A_3 = 6 - 2 = 4.
    got = advantages([1.0, 2.0, 3.0, 6.0], "rloo").tolist()
    assert got == pytest.approx([-8 / 3, -4 / 3, 0.0, 4.0], rel=1e-14)


@settings(max_examples=50, deadline=None)
@given(rewards=rewards_lists)
def test_built_in_estimators_match_their_definitions_loop_by_loop(rewards):
    r = torch.tensor(rewards, dtype=torch.float64)
    g = len(rewards)
    if bool((r == r[0]).all()):
        for name in ("grpo", "drgrpo", "rloo"):
            assert advantages(rewards, name).abs().max() == 0.0
        return
    mu, sigma = r.mean(), r.std(correction=0)
    grpo = [(x - mu) / (sigma + 1e-6) for x in r]
    rloo = [x - (r.sum() - x) / (g - 1) for x in r]
    scale = max(1.0, float(r.abs().max()))
    assert torch.allclose(
        advantages(rewards, "grpo"), torch.stack(grpo), rtol=0, atol=1e-12 * scale / float(sigma)
    )
    assert torch.allclose(advantages(rewards, "drgrpo"), r - mu, rtol=0, atol=1e-12 * scale)
    assert torch.allclose(advantages(rewards, "rloo"), torch.stack(rloo), rtol=0, atol=1e-12 * scale)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
@pytest.mark.parametrize("rewards", [[3.5], [0.25, 0.25, 0.25], [7.0] * 16])
def test_a_group_of_one_or_of_equal_rewards_has_exactly_zero_advantage(name, rewards):
    assert advantages(rewards, name, eps=0.0).tolist() == [0.0] * len(rewards)


def test_names_are_case_insensitive_and_the_enum_is_accepted():
    assert get_estimator("GRPO") is get_estimator(EstimatorName.GRPO) is get_estimator("grpo")


def test_the_enum_of_names_is_derived_from_the_built_in_registrations():
    assert [(e.name, e.value) for e in EstimatorName] == [
        ("DRGRPO", "drgrpo"),
        ("GRPO", "grpo"),
        ("RLOO", "rloo"),
    ]
    assert EstimatorName.GRPO == "grpo" and isinstance(EstimatorName.RLOO, str)


def test_only_an_estimator_registered_as_dividing_by_the_std_takes_the_objectives_std_and_scale():
    from thundersync_lightning.core.grpo.estimators import divides_by_std

    assert [n for n in ("grpo", "drgrpo", "rloo") if divides_by_std(n)] == ["grpo"]
    calls = []

    @register_estimator("test-normalised", overwrite=True, divides_by_std=True)
    def normalised(rewards, eps, **options):  # noqa: ANN001, ANN003, ANN202
        calls.append(options)
        return 1.0, float(-rewards.mean())

    r = torch.tensor([0.0, 2.0], dtype=torch.float64)
    Objective(estimator="test-normalised", std="sample", scale="batch").coefficients(r)
    assert calls == [{"correction": 1, "per_group": False}]
    # a lone member under singleton="reward" has sigma = 1: a_g = 1/(1+eps), as grpo's
    one = torch.tensor([3.0], dtype=torch.float64)
    assert Objective(estimator="test-normalised", singleton="reward", eps=0.5).coefficients(one) == (
        1 / 1.5,
        0.0,
    )
    assert Objective(estimator="rloo", singleton="reward", eps=0.5).coefficients(one) == (1.0, 0.0)


def test_an_estimator_named_as_module_and_function_is_imported_from_a_yaml_objective(tmp_path, monkeypatch):
    import yaml

    (tmp_path / "my_house_advantages.py").write_text(
        "def below_best(rewards, eps):\n    return 2.0, float(-2.0 * rewards.max())\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    objective = Objective.of(yaml.safe_load("estimator: my_house_advantages:below_best"))
    assert objective.estimator == "my_house_advantages:below_best"
    assert "my_house_advantages:below_best" in available_estimators()
    assert objective.advantages(torch.tensor([1.0, 3.0, 2.0], dtype=torch.float64)).tolist() == [
        -4.0,
        0.0,
        -2.0,
    ]
    with pytest.raises(ValueError, match="module 'no_such_house_module' cannot be imported"):
        Objective(estimator="no_such_house_module:fn")


def test_an_unknown_estimator_raises_listing_the_valid_names():
    with pytest.raises(
        ValueError, match="unknown advantage estimator 'ppo'; valid names: .*drgrpo, grpo, .*rloo"
    ):
        get_estimator("ppo")
    with pytest.raises(ValueError, match="valid names"):
        StreamingGRPO(list(MLPPolicy().parameters()), estimator="ppo")
    with pytest.raises(ValueError, match="valid names"):
        advantages([0.0, 1.0], "ppo")


def _sign_advantage(rewards: torch.Tensor, eps: float) -> tuple[float, float]:
    """A_i = 2 (r_i - max r): every trajectory but the best is pushed down (affine: a=2, b=-2 max)."""
    return 2.0, float(-2.0 * rewards.max())


def test_a_registered_estimator_streams_the_same_gradient_as_its_reference():
    register_estimator("test-below-best", _sign_advantage, overwrite=True)
    assert "test-below-best" in available_estimators()
    assert advantages([1.0, 3.0, 2.0], "test-below-best").tolist() == [-4.0, 0.0, -2.0]
    policy = MLPPolicy(torch.float64)
    params = list(policy.parameters())
    batch = Batch.of([1.0, 3.0, 2.0, 0.5], [0.0, 1.0], [4.0])
    got, _ = stream(params, batch, policy.score, estimator="test-below-best")
    assert relative_error(got, reference_gradient(params, batch, policy.score, "test-below-best")) <= 1e-12


def test_registering_an_existing_name_without_overwrite_raises():
    with pytest.raises(ValueError, match="already registered; pass overwrite=True"):
        register_estimator("grpo", _sign_advantage)
    assert advantages([0.0, 1.0], "grpo").tolist() == pytest.approx([-1.0, 1.0], rel=1e-5)
