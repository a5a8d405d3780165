"""docs/trl.md's worked tool agent: a TRL user's pieces taken verbatim from the page (a
conversational dataset with extra columns, a function tool, two TRL-signature rewards that decline
rows with None, one of them async, reward weights, an environment class with ``get_reward``, a
separate eval file) fitted through the page's YAML (``thundersync-lightning fit``) and its Python
``Trainer(strategy="thundersync")`` call; streaming and sync train the same step-0 gradient; the
completions every reward declines are counted as unscorable."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.envs.qwen_style import save_model

DOC = Path(__file__).resolve().parents[1] / "docs" / "trl.md"
EVAL_ROW = {"prompt": [{"role": "user", "content": "What is 4 + 4?"}], "answer": "8", "kind": "math"}


def blocks(language: str) -> list[str]:
    parts = DOC.read_text().split(f"```{language}\n")[1:]
    return [p[: p.index("```")] for p in parts]


def write_project(directory: Path) -> None:
    """The page's files as a user saves them, and a tiny model with a Qwen3-style chat template."""
    agent, run = blocks("python")
    (directory / "my_agent.py").write_text(agent)
    (directory / "run.py").write_text(run)
    (directory / "agent.yaml").write_text(blocks("yaml")[0])
    (directory / "train.jsonl").write_text(blocks("json")[0])
    (directory / "test.jsonl").write_text(json.dumps(EVAL_ROW) + "\n")
    save_model(str(directory / "model"))
    directory.chmod(0o755)  # confined workers run as a uid of their own: the user's module directory is o+rx


def environment(directory: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(directory), os.environ.get("PYTHONPATH", "")]),
    }


def test_the_pages_rows_are_trls_conversational_format_with_extra_columns_and_a_row_every_reward_declines():
    rows = [json.loads(line) for line in blocks("json")[0].splitlines()]
    assert all(isinstance(r["prompt"], list) and {"answer", "kind"} <= set(r) for r in rows)
    assert any(r["answer"] is None and r["kind"] == "chat" for r in rows)


@pytest.mark.slow  # a fit of two steps through the CLI (~30 s on 2 cores)
def test_the_documented_yaml_fits_the_trl_pieces_and_counts_the_unscorable_completions(tmp_path):
    write_project(tmp_path)
    cli = Path(sys.executable).with_name("thundersync-lightning")
    proc = subprocess.run(
        [
            str(cli),
            "fit",
            "--config",
            "agent.yaml",
            f"--trainer.default_root_dir={tmp_path / 'run'}",
            "--trainer.enable_progress_bar=false",
            "--trainer.accelerator=cpu",
        ],
        cwd=tmp_path,
        env=environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["trajectories"] == 2 * 2 * 4
    assert summary["unscorable_fraction"] == 0.5  # the chat row's group, every step: every reward declined it
    assert summary["reward_error_fraction"] == 0.0
    assert (
        "Every reward returned None for a completion of row 1 of " in proc.stderr
    )  # warned once, with its row
    records = [
        json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    ]
    assert {r["failure"] for r in records} == {None}


@pytest.mark.slow  # the page's Python block runs as a user's script (~30 s)
def test_the_documented_python_trainer_call_fits_the_trl_pieces(tmp_path):
    write_project(tmp_path)
    proc = subprocess.run(
        [sys.executable, "run.py"],
        cwd=tmp_path,
        env=environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["unscorable_fraction"] == 0.5


def step0_gradient(directory: Path, mode: str) -> Any:
    """The gradient the optimizer is about to apply at step 0, float64, the page's pieces in Python."""
    import lightning as L
    import torch
    from lightning.pytorch import Callback

    from thundersync_lightning.envs.datasets import DatasetTasks
    from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
    from thundersync_lightning.rollout import EmbeddedEngineConfig
    from thundersync_lightning.strategy import ThunderSyncStrategy

    my_agent = importlib.import_module("my_agent")  # the user's module, on sys.path by the test

    class Capture(Callback):
        def __init__(self) -> None:
            self.grads: list[torch.Tensor] = []

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            self.grads.append(
                torch.cat(
                    [p.grad.detach().reshape(-1).clone() for p in pl_module.parameters() if p.requires_grad]
                )
            )

    model = str(directory / "model")
    tasks = DatasetTasks(
        str(directory / "train.jsonl"),
        eval_dataset=str(directory / "test.jsonl"),
        tokenizer_path=model,
        tools=[my_agent.calculator],
        environment_factory=my_agent.Scratchpad,
        reward=[my_agent.correctness, my_agent.brevity],
        reward_weights=[1.0, 0.5],
        max_action_tokens=24,
        max_turns=2,
        template_kwargs={"enable_thinking": False},
    )
    data = RolloutDataModule(
        tasks=tasks,
        engine=EmbeddedEngineConfig(num_threads=1, env_workers=2),
        group_size=4,
        groups_per_step=2,
        seed=0,
    )
    capture = Capture()
    L.seed_everything(0)
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
        default_root_dir=str(directory / mode),
    )
    trainer.fit(GRPOPolicy(pretrained_path=model, dtype="float64", lr=1e-4, objective="trl"), data)
    (grad,) = capture.grads
    return grad


@pytest.mark.slow  # two one-step fits in float64 (~20 s)
def test_streaming_and_sync_train_the_same_step0_gradient_on_the_trl_pieces(tmp_path, monkeypatch):
    write_project(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delitem(sys.modules, "my_agent", raising=False)
    streaming, sync = step0_gradient(tmp_path, "streaming"), step0_gradient(tmp_path, "sync")
    assert float(streaming.norm()) > 0  # the brevity reward differs within the math group: something trains
    # the learner is float64; the engine's float32 sampling logprobs (TRL's IS correction reads them) differ
    # with how its batches formed, ~1e-7 (tests/strategy/test_objective_checks_modes.py's bound)
    assert float((streaming - sync).norm()) <= 1e-5 * float(sync.norm())


@pytest.mark.slow  # a one-step fit of a user's script (~25 s)
def test_the_pieces_pasted_into_the_script_itself_run_in_the_engines_process(tmp_path):
    """A tool, rewards and an environment class defined in ``__main__``: no worker can import them, so
    they run in threads of the engine's process (with the same deadlines); the fit is the same."""
    write_project(tmp_path)
    agent, run = blocks("python")
    script = (
        agent
        + "\n\n"
        + run.replace("from my_agent import Scratchpad, brevity, calculator, correctness\n", "")
    )
    script = script.replace('logger=ThunderSyncWandbLogger(project="calc-agent")', "logger=False")
    script = script.replace("max_steps=2", "max_steps=1, enable_progress_bar=False")
    script = script.replace("default_callbacks()", "default_callbacks(progress_bar=False)")
    assert "import my_agent" not in script and "from my_agent" not in script
    (tmp_path / "main_run.py").write_text(script)
    proc = subprocess.run(
        [sys.executable, "main_run.py"],
        cwd=tmp_path,
        env=environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (
        summary["steps"] == 1
        and summary["unscorable_fraction"] == 0.5
        and summary["reward_error_fraction"] == 0.0
    )
