"""Nothing lost on Ctrl-C: a real SIGINT to a real toy fit leaves last.ckpt (and summary.json) at the
step it reached, and resuming from it gives the parameters of the uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback

from tests.strategy._fit import fit, relative
from thundersync_lightning.callbacks import InterruptCheckpoint, RunSummary, default_callbacks
from thundersync_lightning.modules import RolloutDataModule
from thundersync_lightning.rollout import EmbeddedEngineConfig


class SigintAt(Callback):
    """Sends this process a real SIGINT once, in step ``step``: before it starts (after every callback
    has seen step ``step - 1``) or inside it, once its first trajectory has landed (``mid``)."""

    def __init__(self, step: int, mid: bool, signum: int = signal.SIGINT) -> None:
        self.step, self.mid, self.sent, self.signum = step, mid, False, signum

    def _send(self) -> None:
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)

    def on_rollout_progress(self, trainer: Any, pl_module: Any, progress: Any) -> None:
        if self.mid and progress.step == self.step and progress.content_ready > 0:
            self._send()

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        if not self.mid and trainer.global_step == self.step:
            self._send()


@pytest.fixture
def sigint_handler():
    """Lightning ignores SIGINT after an interrupt (its graceful shutdown): restore pytest's."""
    saved = signal.getsignal(signal.SIGINT)
    # an earlier fit in this process may have left Lightning's "ignore SIGINT" in place
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, saved)


@pytest.mark.parametrize(
    "mode, mid",
    [
        ("streaming", True),
        ("streaming", False),
        ("sync", True),
        pytest.param("sync", False, marks=pytest.mark.slow),
        ("async", True),
        ("async", False),
    ],
)
def test_a_sigint_leaves_last_ckpt_at_the_step_reached_and_resuming_it_is_the_uninterrupted_run(
    tmp_path, sigint_handler, mode, mid
):
    # float64: completion order (timing) still changes summation order, and AdamW's per-coordinate
    # normalisation lifts that rounding where a gradient is mostly cancellation; in float32 it would
    # reach the 1e-6 bound in every mode alike, whatever the resume does
    uninterrupted, uninterrupted_steps, _ = fit(mode, steps=4, precision="64-true")
    root = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:  # Lightning's graceful shutdown after KeyboardInterrupt
        fit(mode, steps=4, root=str(root), enable_checkpointing=True, precision="64-true",
            callbacks=[SigintAt(2, mid), RunSummary(print_summary=False), InterruptCheckpoint()])  # fmt: skip
    assert stopped.value.code == 1
    last = root / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 2
    summary = json.loads((root / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["stopped_by"] == "KeyboardInterrupt"

    resumed, steps, _ = fit(mode, steps=4, root=str(root), resume_from=str(last), precision="64-true",
                            callbacks=[RunSummary(print_summary=False)])  # fmt: skip
    assert [s.step for s in steps] == [2, 3]
    # the same staleness pattern (async: 1 from the resumed step on, as uninterrupted)
    assert [s.staleness_max for s in steps] == [s.staleness_max for s in uninterrupted_steps[2:]]
    assert resumed.dtype == torch.float64 and relative(resumed, uninterrupted) <= 1e-6
    assert json.loads((root / "summary.json").read_text())["steps"] == 4


def test_a_sigterm_inside_a_step_ends_the_fit_at_once_with_last_ckpt_at_the_step_reached(tmp_path):
    saved = signal.getsignal(signal.SIGTERM)
    root = tmp_path / "run"
    try:
        with pytest.raises(
            SystemExit
        ) as stopped:  # Lightning's SIGTERMException, raised where the learner waits
            fit(
                "streaming",
                steps=4,
                root=str(root),
                enable_checkpointing=True,
                callbacks=[
                    SigintAt(2, True, signal.SIGTERM),
                    RunSummary(print_summary=False),
                    InterruptCheckpoint(),
                ],
            )
    finally:
        assert signal.getsignal(signal.SIGTERM) is saved  # the fit put the handler back
        signal.signal(signal.SIGTERM, saved)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2
    summary = json.loads((root / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["stopped_by"] == "SIGTERMException"


def test_a_fit_that_ends_off_the_periodic_checkpoint_still_leaves_last_ckpt_at_its_final_step(tmp_path):
    _, _, trainer = fit("streaming", steps=3, root=str(tmp_path), enable_checkpointing=True,
                        callbacks=[InterruptCheckpoint()])  # fmt: skip
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 3


def test_an_error_at_set_up_writes_no_checkpoint(tmp_path):
    from thundersync_lightning.core.errors import ConfigError
    from thundersync_lightning.envs.toy import GuessingGameTasks

    class NoEnvironments(GuessingGameTasks):
        make_env = None  # breaks the task contract: refused when the data module sets up

    with pytest.raises(ConfigError):
        fit("streaming", steps=2, root=str(tmp_path), enable_checkpointing=True,
            data=RolloutDataModule(tasks=NoEnvironments(), engine=EmbeddedEngineConfig(num_threads=1),
                                   group_size=2, groups_per_step=2),
            callbacks=[InterruptCheckpoint()])  # fmt: skip
    assert not (tmp_path / "checkpoints").exists()


def test_the_default_callbacks_checkpoint_every_50_steps_and_on_interrupt_or_can_leave_checkpoints_out():
    from lightning.pytorch.callbacks import ModelCheckpoint

    callbacks = default_callbacks()
    periodic = [cb for cb in callbacks if isinstance(cb, ModelCheckpoint)]
    assert len(periodic) == 1 and periodic[0].save_last and periodic[0]._every_n_train_steps == 50
    assert any(isinstance(cb, InterruptCheckpoint) for cb in callbacks)
    bare = default_callbacks(checkpoint_every_n_steps=None)
    assert not any(isinstance(cb, (ModelCheckpoint, InterruptCheckpoint)) for cb in bare)


def test_resuming_into_another_mode_or_directory_is_refused_naming_each_override(tmp_path):
    from thundersync_lightning.callbacks import RunChecks
    from thundersync_lightning.core.errors import ConfigError

    sync_dir = tmp_path / "sync"
    fit(
        "sync",
        steps=1,
        root=str(sync_dir),
        enable_checkpointing=True,
        callbacks=[RunChecks(), InterruptCheckpoint()],
    )
    last = sync_dir / "checkpoints" / "last.ckpt"
    with pytest.raises(ConfigError) as refused:
        fit("streaming", steps=2, root=str(tmp_path / "toy"), resume_from=str(last), callbacks=[RunChecks()])
    text = str(refused.value)
    assert "--trainer.strategy.init_args.mode=sync" in text
    assert f"--trainer.default_root_dir={sync_dir.resolve()}" in text and "resume_changes='warn'" in text
    with pytest.warns(UserWarning, match="Resuming anyway"):
        _, steps, _ = fit("streaming", steps=2, root=str(tmp_path / "toy"), resume_from=str(last),
                          callbacks=[RunChecks(resume_changes="warn")])  # fmt: skip
    assert [s.step for s in steps] == [1]
    _, steps, _ = fit("sync", steps=2, root=str(sync_dir), resume_from=str(last), callbacks=[RunChecks()])
    assert [s.step for s in steps] == [1]  # the same run resumes


def test_a_changed_objective_is_a_resume_difference_and_a_moved_run_directory_is_not(tmp_path):
    from thundersync_lightning.callbacks.run_checks import resume_differences

    run = {"mode": "sync", "objective": {"estimator": "grpo", "kl_coef": 0.0}, "root_dir": "/runs/a"}
    moved = {**run, "root_dir": str(tmp_path)}
    assert resume_differences(run, moved, str(tmp_path / "checkpoints" / "last.ckpt")) == []
    (objective,) = resume_differences(run, {**run, "objective": {"estimator": "rloo", "kl_coef": 0.0}}, None)
    assert objective.startswith("objective: estimator 'grpo' in the checkpoint, 'rloo' here")


def test_a_sigint_while_a_step_is_being_recorded_is_held_until_every_callback_recorded_it(
    tmp_path, sigint_handler
):
    class SigintAtBatchEnd(Callback):  # listed first: the later callbacks have not seen the step yet
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == 2:
                os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(SystemExit):
        fit("streaming", steps=4, root=str(tmp_path), enable_checkpointing=True,
            callbacks=[SigintAtBatchEnd(), RunSummary(print_summary=False),
                       InterruptCheckpoint()])  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == summary["steps"] == 2  # step 1 is in both, not only in the weights
    handler = signal.getsignal(signal.SIGINT)
    assert (
        getattr(handler, "__func__", None) is not InterruptCheckpoint._note_interrupt
    )  # the hold was released
