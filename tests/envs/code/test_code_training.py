"""`thundersync-lightning fit --config configs/code_local.yaml` trains on the local code tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from .._support import needs_bwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@needs_bwrap
@pytest.mark.slow
def test_the_code_local_config_trains_a_step_with_sandboxed_episodes(tmp_path):
    with open(os.path.join(ROOT, "configs/code_local.yaml")) as f:
        config = yaml.safe_load(f)
    config["trainer"].update(default_root_dir=str(tmp_path), max_steps=1, enable_progress_bar=False)
    config["data"].update(groups_per_step=2, group_size=2)
    config["data"]["tasks"]["init_args"].update(
        max_turns=2,
        max_action_tokens=64,
        sandbox_root="/tmp/thundersync-test-sandboxes",
        uid_base=3_980_000,
        uid_count=32,
    )
    path = tmp_path / "code_local.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = os.path.join(os.path.dirname(sys.executable), "thundersync-lightning")
    args = [cli, "fit", "--config", str(path)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    run = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    with open(tmp_path / "summary.json") as f:
        summary = json.load(f)
    assert summary["steps"] == 1 and summary["trajectories"] == 4
