"""Shared fixtures: one embedded engine for the module-level tests (start-up costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from thundersync_lightning.envs.toy import toy_model_spec
from thundersync_lightning.rollout import EmbeddedEngine, EmbeddedEngineConfig, ModelSpec, build_model

from .scripted import MODES, ScriptedTasks

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def spec() -> ModelSpec:
    return toy_model_spec()


@pytest.fixture(scope="session")
def scripted_tasks() -> ScriptedTasks:
    return ScriptedTasks(modes=MODES)


@pytest.fixture(scope="session")
def engine(spec: ModelSpec, scripted_tasks: ScriptedTasks) -> Iterator[EmbeddedEngine]:
    """Serves ScriptedTasks; group g of a request behaves as MODES[g % 7] (group 0 is well-behaved)."""
    eng = EmbeddedEngineConfig(step_timeout_s=0.5, verdict_timeout_s=0.5, env_workers=16).build(
        spec, scripted_tasks
    )
    yield eng
    eng.shutdown()


def random_model(spec: ModelSpec, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(spec)
