"""Estimators, rewards and tool parsers: one registry helper, one behaviour."""

from __future__ import annotations

import pytest
import torch

from thundersync_lightning.core import ConfigError, Objective
from thundersync_lightning.core.grpo.estimators import get_estimator, grpo_coefficients, register_estimator
from thundersync_lightning.envs.datasets.rewards import get_reward, register_reward
from thundersync_lightning.envs.tools.parsers import get_tool_parser, register_tool_parser

REGISTRIES = {
    "estimator": (register_estimator, get_estimator, "advantage estimator", "grpo", "gpro"),
    "reward": (register_reward, get_reward, "reward", "exact_match", "exact_mach"),
    "tool parser": (register_tool_parser, get_tool_parser, "tool parser", "hermes", "hermse"),
}


def _fn(*args, **kwargs):
    return 0.0, 0.0


def _other(*args, **kwargs):
    return 1.0, 0.0


@pytest.mark.parametrize("kind", sorted(REGISTRIES))
def test_every_registry_refuses_a_taken_name_unless_overwrite_and_takes_both_forms(kind):
    register, get, label, builtin, _ = REGISTRIES[kind]
    with pytest.raises(ConfigError, match=f"{label} '{builtin}' is already registered.*overwrite=True"):
        register(builtin, _fn)
    name = f"test-house-{kind.replace(' ', '-')}"
    assert register(name, _fn, overwrite=True) is _fn  # the call form
    assert register(name, _fn) is _fn  # the same function again is no duplicate
    with pytest.raises(ConfigError, match="already registered"):
        register(name)(_other)  # the decorator form, another function
    assert register(name, overwrite=True)(_other) is _other
    assert get(name) is _other


@pytest.mark.parametrize("kind", sorted(REGISTRIES))
def test_an_unknown_name_lists_the_valid_names_and_a_close_one(kind):
    _, get, label, builtin, typo = REGISTRIES[kind]
    with pytest.raises(
        ConfigError, match=rf"unknown {label} '{typo}'; valid names: .*{builtin}.*did you mean '{builtin}'"
    ):
        get(typo)


def test_the_built_in_grpo_is_the_registered_one_and_the_objective_uses_it():
    assert get_estimator("grpo") is grpo_coefficients
    r = torch.tensor([0.0, 1.0, 1.0, 3.0], dtype=torch.float64)
    assert Objective().coefficients(r) == grpo_coefficients(r, 1e-6)
    assert Objective(std="sample").coefficients(r) == grpo_coefficients(r, 1e-6, correction=1)
    assert Objective(scale="batch").coefficients(r) == grpo_coefficients(r, 1e-6, per_group=False)
