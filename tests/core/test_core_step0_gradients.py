"""The step-0 gradient of every mode and estimator on the toy equals the stored before-values.

A refactor of the scoring, the accumulator or the runner must not change what a step trains: the
gradient the optimizer is about to apply at step 0 (float64 weights, so summation order shows only
at ~1e-15) is summarised by its norm, each parameter's norm and eight seeded random projections,
and each number must equal the stored one within 1e-6 relative. The stored values were written by
the code before the house refactor (``STEP0_WRITE=1 pytest tests/core/test_core_step0_gradients.py``
rewrites them; do that only for an intended change of the gradient, and say why in the commit).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch import Callback

from thundersync_lightning.core import Objective, available_estimators
from thundersync_lightning.envs.toy import GuessingGameTasks, toy_model_spec
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.rollout import EmbeddedEngineConfig
from thundersync_lightning.strategy import ThunderSyncStrategy

STORED = Path(__file__).parent / "data" / "step0_gradients.json"
RELATIVE = 1e-6
MODES = ("streaming", "sync", "async")
PROJECTIONS = 8
#: objectives beyond the plain estimators: the per-token options the scoring applies
OPTIONS: dict[str, dict[str, Any]] = {
    "trl-kl-entropy-overlong": dict(
        preset="trl",
        kl_coef=0.05,
        entropy_coef=0.01,
        overlong_filter=True,
        overlong_buffer=2,
        overlong_max_tokens=4,
    ),
    "verl-rejection-kl": dict(
        preset="verl", rs="token_k1,seq_mean_k3", rs_threshold="0.999_1.001,0.01", kl_coef=0.05
    ),
}


class _GradientAtBarrier(Callback):
    def __init__(self) -> None:
        self.grads: list[torch.Tensor] = []

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        ps = [p for p in pl_module.parameters() if p.requires_grad]
        self.grads.append(torch.cat([p.grad.detach().reshape(-1).clone() for p in ps]))
        self.sizes = [p.numel() for p in ps]


def _objective(name: str) -> Objective:
    if name in OPTIONS:
        spec = dict(OPTIONS[name])
        return Objective.preset(spec.pop("preset"), **spec)
    return Objective(estimator=name)


def _summary(mode: str, name: str) -> dict[str, Any]:
    L.seed_everything(0)
    policy = GRPOPolicy(config=dict(toy_model_spec().config), dtype="float64", objective=_objective(name))
    capture = _GradientAtBarrier()
    trainer = L.Trainer(
        strategy=ThunderSyncStrategy(mode=mode),
        accelerator="cpu",
        devices=1,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[capture],
    )
    data = RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"),
        engine=EmbeddedEngineConfig(num_threads=1, env_workers=2),
        group_size=4,
        groups_per_step=2,
        seed=0,
    )
    trainer.fit(policy, data)
    (grad,) = capture.grads
    g = torch.Generator().manual_seed(1234)
    directions = torch.randn(PROJECTIONS, grad.numel(), generator=g, dtype=torch.float64)
    return {
        "norm": float(grad.norm()),
        "parameter_norms": [float(p.norm()) for p in grad.split(capture.sizes)],
        "projections": [float(x) for x in directions @ grad],
    }


CASES = [(mode, name) for name in available_estimators() for mode in MODES] + [
    ("streaming", name) for name in OPTIONS
]


def _key(mode: str, name: str) -> str:
    return f"{mode}/{name}"


def _close(got: float, want: float, scale: float) -> bool:
    return abs(got - want) <= RELATIVE * max(abs(want), scale)


@pytest.mark.parametrize(("mode", "name"), CASES, ids=[_key(*c) for c in CASES])
def test_the_step0_gradient_equals_the_stored_before_value(mode, name):
    got = _summary(mode, name)
    if os.environ.get("STEP0_WRITE") == "1":
        stored = json.loads(STORED.read_text()) if STORED.exists() else {}
        stored[_key(mode, name)] = got
        STORED.write_text(json.dumps(dict(sorted(stored.items())), indent=1) + "\n")
        pytest.skip("stored")
    want = json.loads(STORED.read_text())[_key(mode, name)]
    assert want["norm"] > 0
    assert _close(got["norm"], want["norm"], want["norm"])
    assert len(got["parameter_norms"]) == len(want["parameter_norms"])
    for a, b in zip(got["parameter_norms"], want["parameter_norms"]):
        assert _close(a, b, want["norm"] * 1e-3)
    for a, b in zip(got["projections"], want["projections"]):
        assert _close(a, b, want["norm"])  # a projection near 0 is compared against the gradient's scale


def test_every_registered_estimator_has_stored_values():
    stored = json.loads(STORED.read_text())
    assert {_key(m, n) for m, n in CASES} <= set(stored)
