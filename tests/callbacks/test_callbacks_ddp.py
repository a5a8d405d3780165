"""Metrics over 2 gloo ranks (Lightning DDP on CPU), run as subprocesses (see ddp_script.py)."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.callbacks.helpers import subprocess_env

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: int = 1200) -> None:  # a hang guard: a loaded machine runs it slowly
    # this checkout's package first (an editable install elsewhere must not shadow it)
    env = subprocess_env(PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "src")]), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.callbacks.ddp_script", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


# rank 0: rewards 1 1 0, tokens 4 5 6, staleness 0 0 0, 8 s step, 2 s busy, 15 learner tokens
# rank 1: reward 0, tokens 10, staleness 1, 10 s step, 5 s busy, 10 learner tokens
# flops (TinyLM: N=56, 12LHQ=48): rank 0 = 336*15 + 48*(16+25+36) = 5040 + 3696 = 8736
#                                  rank 1 = 336*10 + 48*100 = 3360 + 4800 = 8160 -> 16896
GLOBAL = {
    "rollout/reward_mean": 0.5,  # 2 of 4 trajectories, not the mean of rank means (1/3)
    "rollout/pass_rate": 0.5,
    "rollout/trajectory_tokens_mean": 6.25,
    "rollout/trajectories_count": 4.0,
    "train/staleness_mean_versions": 0.25,
    "train/staleness_max_versions": 1.0,
    "train/staleness_1_versions_count": 1.0,
    "perf/model_flops_per_step": 16896.0,
    "perf/mfu": 16896 / (10 * 1e6 * 2),  # longest step x peak x 2 devices
    "perf/mfu_busy": 16896 / (7 * 1e6),  # 2 + 5 busy device-seconds
    "perf/learner_idle_fraction": 11 / 18,  # (6 + 5) idle of (8 + 10) s
    "perf/step_seconds": 10.0,
    "memory/accumulator_device_bytes": 300.0,  # the larger rank
}


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    path = tmp_path_factory.mktemp("ddp")
    run(str(path))
    return path


def test_metrics_reduce_over_two_gloo_ranks_and_every_rank_agrees(out):
    tmp_path = out
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["global_step"] == 2
        for key, value in GLOBAL.items():
            assert result["metrics"][key] == pytest.approx(value, rel=1e-12), (rank, key)
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["rollout/reward_mean"]]
    assert len(rows) == 2
    for row in rows:
        for key, value in GLOBAL.items():
            assert float(row[key]) == pytest.approx(value, rel=1e-12), key


def test_the_run_summary_describes_both_ranks(out):
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trajectories"] == 2 * 4  # 3 on rank 0 and 1 on rank 1, per step
    assert summary["reward_mean_first"] == summary["reward_mean_last"] == 0.5  # 2 of 4, not rank 0's 2/3
    assert summary["staleness_max"] == 1  # rank 1's trajectory
    assert summary["learner_idle_fraction"] == pytest.approx(11 / 18, rel=1e-12)
    assert summary["step_seconds_median"] == 10.0  # the longer rank's step


def test_a_stale_trajectory_on_one_rank_makes_every_rank_raise(out):
    r0, r1 = (json.loads((out / f"stale{r}.json").read_text()) for r in (0, 1))
    assert r0["raised"] == r1["raised"] == "StalenessError"
    assert "s0-g0-t0" in r1["message"] and "version 2" in r1["message"]
    assert "rank 0 saw none" in r0["message"]
