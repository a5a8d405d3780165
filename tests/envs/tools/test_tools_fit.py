"""A fit on native tool-call episodes: a pretrained directory with a Qwen3-style template, the
local code tasks in ``tools`` format in bubblewrap, the embedded engine; the step's metrics
include ``rollout/invalid_tool_call_fraction``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .._support import needs_bwrap
from ..qwen_style import save_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

RUN = """
import json, sys
import lightning as L
from thundersync_lightning.callbacks import RolloutMetrics, default_callbacks
from thundersync_lightning.envs.code import LocalCodeTasks
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.rollout import EmbeddedEngineConfig

if __name__ == "__main__":
    model = sys.argv[1]
    tasks = LocalCodeTasks(names=["leap_year"], tokenizer_path=model, action_format="tools", max_turns=2,
                           max_action_tokens=16, sandbox_root="/tmp/thundersync-test-sandboxes",
                           uid_base=3_990_000, uid_count=16)
    data = RolloutDataModule(tasks=tasks, engine=EmbeddedEngineConfig(num_threads=1, env_workers=2),
                             group_size=2, groups_per_step=2)
    callbacks = default_callbacks(progress_bar=False, checkpoint_every_n_steps=None)
    trainer = L.Trainer(strategy="thundersync", accelerator="cpu", devices=1, max_steps=1,
                        log_every_n_steps=1, logger=False, default_root_dir="run", enable_checkpointing=False,
                        enable_progress_bar=False, callbacks=callbacks)
    trainer.fit(GRPOPolicy(pretrained_path=model), data)
    metrics = next(c for c in callbacks if isinstance(c, RolloutMetrics)).last_metrics
    json.dump(metrics, open("metrics.json", "w"))
"""


@needs_bwrap
@pytest.mark.slow
def test_a_fit_on_tool_call_episodes_logs_the_invalid_tool_call_fraction(tmp_path):
    save_model(str(tmp_path / "model"))
    (tmp_path / "run.py").write_text(RUN)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "run.py", str(tmp_path / "model")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["rollout/trajectories_count"] == 4
    assert 0.0 <= metrics["rollout/invalid_tool_call_fraction"] <= 1.0
    first = json.loads((tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()[0])
    assert first["turns"] and first["prompt"]
