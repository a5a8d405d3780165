"""End to end: `thundersync-lightning fit` on the toy config for 2 CPU steps with every monitor and
the W&B logger in offline mode; the run's .wandb file is read back and checked."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.callbacks.helpers import subprocess_env
from tests.callbacks.wandb_offline import read_offline_run

pytest.importorskip("thundersync_lightning.cli", reason="the CLI (issue 4) is not there yet")
ROOT = Path(__file__).resolve().parents[2]


def observability_config(save_dir: str) -> dict:
    """The lines docs/metrics.md tells users to add: the default logger and every monitor."""
    return {
        "trainer": {
            "logger": {
                "class_path": "thundersync_lightning.callbacks.ThunderSyncWandbLogger",
                "init_args": {"project": "tests", "save_dir": save_dir, "mode": "offline"},
            },
            "callbacks": [
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"save_last": True},
                },
                "thundersync_lightning.callbacks.RolloutProgressBar",
                "thundersync_lightning.callbacks.StalenessMonitor",
                "thundersync_lightning.callbacks.MFUMonitor",
                "thundersync_lightning.callbacks.MemoryMonitor",
                "thundersync_lightning.callbacks.IdleTimeMonitor",
                "thundersync_lightning.callbacks.RolloutMetrics",
            ],
        }
    }


@pytest.mark.parametrize("devices", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_two_step_cpu_fit_logs_zero_staleness_mfu_and_memory_to_an_offline_w_and_b_run(tmp_path, devices):
    """With 2 gloo ranks (make test-slow) every key describes both ranks' 16 trajectories."""
    root = tmp_path / "run"
    extra = tmp_path / "observability.yaml"
    extra.write_text(yaml.safe_dump(observability_config(str(root))))
    toy = ROOT / "configs" / "toy.yaml"
    argv = [
        "fit", "--config", str(toy), "--config", str(extra),
        "--trainer.max_steps=2", f"--trainer.default_root_dir={root}",
        "--data.groups_per_step=4", "--data.group_size=4", f"--trainer.devices={devices}",
    ]  # fmt: skip
    # a separate process, as a user runs it: the fit initialises torch.distributed and W&B, which
    # must not leak into the test process (W&B finishes writing its files at exit)
    env = subprocess_env(HF_HUB_OFFLINE="1", WANDB_SILENT="true")
    proc = subprocess.run(
        [sys.executable, "-m", "thundersync_lightning.cli", *argv],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-5000:]

    run = read_offline_run(root)
    rows = [r for r in run["history"] if "perf/mfu" in r]
    assert [r["trainer/global_step"] for r in rows] == [0, 1]
    for row in rows:
        assert row["train/staleness_max_versions"] == 0
        assert row["train/stale_trajectories_count"] == 0
        assert row["train/staleness_0_versions_count"] == 16  # 4 groups x 4 samples, all on-policy
        assert 0 < row["perf/mfu"] <= row["perf/mfu_busy"] <= 1
        assert 0 <= row["perf/learner_idle_fraction"] < 1
        assert row["memory/process_rss_bytes"] > 0
        assert row["memory/accumulator_total_bytes"] > 0
        assert row["rollout/trajectories_count"] == 16
        assert 0 <= row["rollout/reward_mean"] <= 1
    assert run["config"]["perf/peak_flops_source"] == "calibrated"  # CPU: a timed matmul
    for rank in range(devices):
        timeline = (root / "timeline" / f"rank{rank}.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in timeline] == [0, 1]
    assert json.loads((root / "summary.json").read_text())["staleness_max"] == 0
