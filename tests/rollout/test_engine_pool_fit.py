"""Training with a pool of 2 embedded engines equals training with 1 engine (same seeds)."""

from __future__ import annotations

import pytest

from tests.strategy._fit import fit, relative, toy_data
from thundersync_lightning.rollout import EmbeddedEngineConfig, EnginePoolConfig

from .procs import children, wait_until

pytestmark = pytest.mark.timeout(400)

ENGINE = EmbeddedEngineConfig(num_threads=1, env_workers=4)


def _fit(engine, mode: str) -> tuple:
    params, steps, _ = fit(
        mode, steps=2, data=toy_data(engine=engine), dtype="float64"
    )  # summation order only
    trajectories = [
        {
            t.trajectory_id: (t.prompt, tuple(seg.tokens for seg in t.segments), t.reward)
            for t in s.trajectories
        }
        for s in steps
    ]
    return params, trajectories


# async: two requests in flight through the pool with a publish between them (the engine-level
# test of that ordering is fast; this fit is the slow end-to-end check)
@pytest.mark.parametrize("mode", ["streaming", pytest.param("async", marks=pytest.mark.slow)])
def test_a_fit_with_two_embedded_engines_trains_the_parameters_of_one_engine(monkeypatch, mode):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = children()
    one_params, one_steps = _fit(ENGINE, mode)
    two_params, two_steps = _fit(EnginePoolConfig(engine=ENGINE, num_engines=2), mode)
    assert [len(s) for s in two_steps] == [16, 16]
    assert two_steps == one_steps  # the same trajectories (tokens) and rewards, step by step
    # completion order (timing) changes the summation order of the gradient: float noise only
    assert relative(two_params, one_params) <= 1e-5  # measured 2e-6 (async), as data parallel
    assert wait_until(lambda: children() - before == set(), 10.0), "an engine process outlived the fit"
