"""Data parallel on 2 gloo processes equals 1 process; resuming equals the uninterrupted run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from thundersync_lightning.core.evaluation import VALIDATION_METRICS

from ._fit import fit, relative

SCRIPT = Path(__file__).with_name("ddp_script.py")
VALIDATE_SCRIPT = Path(__file__).with_name("ddp_validate_script.py")


def _run(
    tmp_path: Path,
    devices: int,
    mode: str = "streaming",
    objective: str = "default",
    cut: str = "",
    script: Path = SCRIPT,
) -> dict:
    out = tmp_path / f"{script.stem}-{devices}-{objective}-{cut}.pt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(script), str(out), str(devices), mode, objective, cut],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out)


# two gloo processes, each pair of fits ~40 s: make test-slow (make test keeps DDP through test_sharding and
# callbacks/test_ddp); the global objective with the cut covers more than the default uncut
@pytest.mark.slow
@pytest.mark.parametrize("objective, cut", [("default", ""), ("global", "cut")])
def test_two_gloo_processes_give_the_parameters_of_one_process(tmp_path, objective, cut):
    one = _run(tmp_path, 1, objective=objective)  # uncut: the cut on two ranks must match it too
    two = _run(tmp_path, 2, objective=objective, cut=cut)
    assert two["world_size"] == 2
    # each rank trains its own half of the 4 groups (8 of the 16 trajectories)
    assert two["trajectories_per_step"] == [8, 8, 8]
    assert set(two["staleness"]) == {0}
    assert relative(two["params"], one["params"]) <= 1e-5


@pytest.mark.slow  # two gloo processes and one more fit (~35 s)
def test_validation_metrics_on_two_ranks_with_uneven_task_splits_equal_one_process(tmp_path):
    one = _run(tmp_path, 1, script=VALIDATE_SCRIPT)
    two = _run(tmp_path, 2, script=VALIDATE_SCRIPT)
    assert two["world_size"] == 2
    assert set(two["metrics"]) == {f"val/{k}" for k in VALIDATION_METRICS}
    for key, value in one["metrics"].items():  # weighted by tasks/trajectories, not a mean of rank means
        assert two["metrics"][key] == pytest.approx(value, abs=1e-12), key


def test_resuming_from_a_barrier_checkpoint_reproduces_the_uninterrupted_run(tmp_path):
    uninterrupted, _, _ = fit("streaming", steps=4, dtype="float64")  # float64: summation order only
    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1, filename="{step}")
    fit("streaming", steps=2, callbacks=[checkpoints], enable_checkpointing=True, dtype="float64")
    resumed, steps, _ = fit(
        "streaming", steps=4, ckpt_path=None, resume_from=str(tmp_path / "step=2.ckpt"), dtype="float64"
    )
    assert [s.step for s in steps] == [2, 3]
    assert [s.policy_version for s in steps] == [2, 3]
    # completion order (timing) changes summation order: float noise, amplified a little by AdamW
    assert relative(resumed, uninterrupted) <= 1e-5
