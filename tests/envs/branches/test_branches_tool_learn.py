"""configs/tool_learn.yaml (``make demo-tools``) runs as the Makefile runs it: the starting policy
is built, the fit validates the held-out requests at its first step and at its end, and the
summary carries the held-out pass@1 at both. The learning itself is the committed curve
(benchmarks/results/tool_learn.json), written by the full command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow  # builds a starting policy and fits two steps of the demo (~1 min)
def test_the_tool_demo_config_builds_its_start_fits_and_reports_held_out_pass_at_1_first_and_last(tmp_path):
    config = yaml.safe_load((ROOT / "configs" / "tool_learn.yaml").read_text())
    assert config["model"]["pretrained_path"] == config["data"]["tasks"]["init_args"]["tokenizer_path"]
    makefile = (ROOT / "Makefile").read_text()
    assert "envs.branches.start runs/demo-tools/start" in makefile and "configs/tool_learn.yaml" in makefile
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    start = tmp_path / "start"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "thundersync_lightning.envs.branches.start",
            str(start),
            "--steps",
            "5",
            "--copy-name",
            "0.5",
        ],
        check=True,
        env=env,
        cwd=ROOT,
        capture_output=True,
        timeout=600,
    )
    record = json.loads((start / "start.json").read_text())
    assert record["copy_name"] == 0.5 and record["steps"] == 5
    run = tmp_path / "run"
    cli = Path(sys.executable).with_name("thundersync-lightning")
    proc = subprocess.run(
        [str(cli), "fit", "--config", str(ROOT / "configs" / "tool_learn.yaml"),
         f"--trainer.default_root_dir={run}", f"--model.pretrained_path={start}",
         f"--data.tasks.init_args.tokenizer_path={start}", "--trainer.max_steps=2",
         "--trainer.val_check_interval=2", "--data.groups_per_step=2", "--data.val_groups=2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2
    assert 0.0 <= summary["val_pass_at_1_first"] <= 1.0 and 0.0 <= summary["val_pass_at_1_last"] <= 1.0
    (metrics,) = run.glob("csv/version_*/metrics.csv")
    header = metrics.read_text().splitlines()[0].split(",")
    assert {"val/pass_at_1", "rollout/invalid_tool_call_fraction"} <= set(header)
