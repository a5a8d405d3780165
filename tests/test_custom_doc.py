"""docs/custom.md's task and LightningModule, pasted into files as a user would, fit the contract
and train under strategy="thundersync" with the default callbacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "custom.md"

RUN = """
import lightning as L
import thundersync_lightning
from thundersync_lightning.callbacks import default_callbacks
from thundersync_lightning.modules import RolloutDataModule
from thundersync_lightning.rollout import EmbeddedEngineConfig
from thundersync_lightning.core import check_module, check_tasks
from my_policy import MinimalPolicy
from my_task import AddOneTasks

if __name__ == "__main__":
    config = {"vocab_size": 16, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}
    policy, tasks = MinimalPolicy(config), AddOneTasks()
    assert check_module(policy) == [] and check_tasks(tasks) == [], (check_module(policy), check_tasks(tasks))
    data = RolloutDataModule(tasks=tasks, engine=EmbeddedEngineConfig(num_threads=1, env_workers=2),
                             group_size=4, groups_per_step=2)
    trainer = L.Trainer(strategy="thundersync", accelerator="cpu", devices=1, max_steps=2,
                        log_every_n_steps=1, logger=False, default_root_dir="run",
                        enable_checkpointing=False,
                        callbacks=default_callbacks(progress_bar=False, checkpoint_every_n_steps=None))
    trainer.fit(policy, data)
"""


def _blocks(text: str) -> list[str]:
    parts = text.split("```python\n")[1:]
    return [p[: p.index("```")] for p in parts]


@pytest.mark.slow  # the documented task trains for real (~15 s)
def test_the_documented_single_turn_task_and_minimal_module_train_with_the_default_callbacks(tmp_path):
    task, policy = _blocks(DOC.read_text())
    assert len(task.splitlines()) <= 45  # a task of about 30 lines
    (tmp_path / "my_task.py").write_text(task)
    (tmp_path / "my_policy.py").write_text(policy)
    (tmp_path / "run.py").write_text(RUN)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "run.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["trajectories"] == 2 * 8
    first = json.loads((tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()[0])
    assert first["prompt"] in [str(d) for d in range(10)]  # decoded by AddOneTasks.decode
    assert len(first["turns"]) == 1


def test_the_documented_calculator_computes_arithmetic_and_refuses_everything_else():
    (block,) = [b[: b.index("```")] for b in DOC.read_text().split("```py\n")[1:] if "def calculator" in b]
    namespace: dict = {}
    exec(compile(block, "my_agent.py", "exec"), namespace)  # the user's module, as documented
    calculator = namespace["calculator"]
    assert calculator("2 * (3 + 4) - -1") == "15" and calculator("2 ** 10 / 4") == "256.0"
    escape = "().__class__.__base__.__subclasses__()[0]"  # eval's way out to os.popen
    for attack in (
        escape,
        "__import__('os').system('id')",
        "open('/etc/passwd').read()",
        "9 ** 9 ** 9",
        "(10 ** 60) * (10 ** 60)",
        "'a' * 10",
    ):
        with pytest.raises((ValueError, SyntaxError)):
            calculator(attack)
