"""RunSummary and RunChecks across a resume: one W&B run, a summary of the whole run, and a warning
for a resume that runs no step. A stand-in strategy publishes synthetic StepStats."""

from __future__ import annotations

import json
import re

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from tests.callbacks.helpers import StatsStrategy, TinyPolicy, record, stats
from tests.callbacks.wandb_offline import finish_wandb
from thundersync_lightning.callbacks import (
    RunChecks,
    RunSummary,
    ThunderSyncWandbLogger,
    wandb_run_id_from_checkpoint,
)
from thundersync_lightning.callbacks.run_checks import hidden_steps_warning
from thundersync_lightning.core.errors import RunFailed
from thundersync_lightning.summary import StepAggregate, failed_run, summarize


def step_stats(step):
    """Step k: 4 trajectories, k + 1 of them (at most 4) with reward 1; 2 s of an 8 s step busy."""
    trajs = [record(i, step=step, version=step, reward=float(i <= step)) for i in range(4)]
    return stats(trajs, step=step, version=step, start=0.0, end=8.0, busy=())


def fit(root, max_steps, first_step=0, logger=False, ckpt_path=None):
    summary = RunSummary(print_summary=False)
    trainer = pl.Trainer(
        strategy=StatsStrategy(lambda s, rank, world: step_stats(first_step + s)),
        max_steps=max_steps, logger=logger, log_every_n_steps=1, enable_model_summary=False,
        enable_progress_bar=False, default_root_dir=root,
        callbacks=[summary, RunChecks(), ModelCheckpoint(save_last=True, every_n_train_steps=1)],
    )  # fmt: skip
    trainer.fit(TinyPolicy(), ckpt_path=ckpt_path)
    return json.loads((root / "summary.json").read_text())


def test_a_resumed_run_continues_its_w_and_b_run_and_summarises_every_step(tmp_path):
    first = ThunderSyncWandbLogger(save_dir=str(tmp_path), mode="offline", project="tests")
    fit(tmp_path, 2, logger=first)
    finish_wandb()
    last = tmp_path / "checkpoints" / "last.ckpt"  # RunChecks put the checkpoints under DIR
    assert wandb_run_id_from_checkpoint(last) == first.version

    again = ThunderSyncWandbLogger(
        save_dir=str(tmp_path), mode="offline", project="tests", resume_from_checkpoint=str(last)
    )
    summary = fit(tmp_path, 3, first_step=2, logger=again, ckpt_path=last)
    finish_wandb()
    assert again.version == first.version
    runs = sorted(p.name for p in (tmp_path / "wandb").glob("offline-run-*"))
    # offline-run-<time>-<id>, wandb adds "-1" when both fits start within the same second
    ids = [re.fullmatch(r"offline-run-\d{8}_\d{6}-(\w+?)(-\d+)?", name) for name in runs]
    assert len(runs) == 2 and all(m is not None and m.group(1) == first.version for m in ids), runs
    # steps 0, 1, 2 with 1, 2, 3 of 4 rewards: the whole run, not only the resumed step
    assert (summary["steps"], summary["steps_this_fit"], summary["trajectories"]) == (3, 1, 12)
    assert summary["reward_window_steps"] == 1
    assert (summary["reward_mean_first"], summary["reward_mean_last"]) == (0.25, 0.75)
    assert summary["learner_idle_fraction"] == 1.0
    assert (tmp_path / "reward_curve.png").read_bytes().startswith(b"\x89PNG")


def test_a_resume_at_or_past_max_steps_warns_and_keeps_the_whole_run_summary(tmp_path):
    fit(tmp_path, 2)
    with pytest.warns(UserWarning, match="step 2 with max_steps=2: this fit runs no step"):
        summary = fit(tmp_path, 2, first_step=2, ckpt_path=tmp_path / "checkpoints" / "last.ckpt")
    assert (summary["steps"], summary["steps_this_fit"], summary["reward_mean_last"]) == (2, 0, 0.5)


def test_logging_less_than_every_tenth_step_of_the_run_is_warned_about():
    assert "only 6 of the run's 300 steps" in hidden_steps_warning(50, 300)
    assert hidden_steps_warning(30, 300) is None  # 10 points: enough to see a trend
    assert hidden_steps_warning(1, 5) is None
    assert hidden_steps_warning(50, -1) is None  # no step limit: nothing to compare with


def test_the_summary_weights_steps_by_their_trajectories_and_counts_zero_advantage_groups():
    def agg(step, rewards, n, zero):
        return StepAggregate(step, sum(rewards), len(rewards), n, 0, 2.0, 2.0, 1.0, 2, zero)

    summary = summarize([agg(0, [1.0], 2, 2), agg(1, [0.0, 0.0, 1.0], 3, 1)], "sync", 5.0, window=2)
    assert summary["reward_mean_first"] == 0.5  # 2 of 4 rewards, not the mean of step means (2/3)
    assert summary["zero_advantage_group_fraction"] == 3 / 4
    assert summary["learner_idle_fraction"] == 0.5
    assert summary["engine_learner_kl_max"] is None  # no step recorded the on-policy check
    with_kl = [
        agg(0, [1.0], 2, 0),
        StepAggregate(1, 1.0, 1, 1, 0, 2.0, 2.0, 1.0, 1, 0, engine_learner_kl=3e-7),
    ]
    assert summarize(with_kl, "streaming", 1.0)["engine_learner_kl_max"] == 3e-7


def test_tool_failures_are_fractions_of_the_calls_and_a_run_whose_every_call_failed_is_named():
    def agg(step, calls, invalid, errors, timeouts):
        return StepAggregate(
            step,
            1.0,
            1,
            1,
            0,
            2.0,
            2.0,
            1.0,
            1,
            0,
            tool_calls=calls,
            invalid_tool_calls=invalid,
            tool_errors=errors,
            tool_timeouts=timeouts,
        )

    summary = summarize([agg(0, 4, 1, 1, 1), agg(1, 4, 0, 1, 0)], "streaming", 1.0)
    assert (summary["tool_calls"], summary["tool_calls_run"]) == (8, 7)
    assert summary["tool_error_fraction"] == 2 / 8 and summary["tool_timeout_fraction"] == 1 / 8
    assert failed_run(summary) is None
    broken = summarize([agg(0, 4, 1, 2, 1)], "streaming", 1.0)  # 3 calls ran, 3 failed
    assert "every one of the run's 3 tool calls that ran failed" in failed_run(
        {**broken, "tool_error_first": "x"}
    )
    assert summarize([agg(0, 0, 0, 0, 0)], "sync", 1.0)["tool_error_fraction"] is None


def test_a_fit_whose_every_reward_failed_writes_its_summary_then_raises_run_failed(tmp_path):
    def failing(step, rank, world):
        trajs = [
            record(i, step=step, reward=0.0, failure="RewardError: reward 'correct' raised KeyError")
            for i in range(4)
        ]
        return stats(trajs, step=step, start=0.0, end=1.0, busy=())

    trainer = pl.Trainer(
        strategy=StatsStrategy(failing), max_steps=2, logger=False, enable_model_summary=False,
        enable_progress_bar=False, enable_checkpointing=False, default_root_dir=tmp_path,
        callbacks=[RunSummary(print_summary=False)],
    )  # fmt: skip
    with pytest.raises(RunFailed, match="every reward of the run's 8 trajectories failed"):
        trainer.fit(TinyPolicy())
    assert json.loads((tmp_path / "summary.json").read_text())["reward_error_fraction"] == 1.0


def test_an_interrupted_fit_still_writes_the_summary_of_the_steps_it_ran(tmp_path):
    class Interrupt(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 2:
                raise RuntimeError("a failure in step 3")  # (Ctrl-C takes the same on_exception path)

    trainer = pl.Trainer(
        strategy=StatsStrategy(lambda s, rank, world: step_stats(s)), max_steps=5, logger=False,
        enable_model_summary=False, enable_progress_bar=False, enable_checkpointing=False,
        default_root_dir=tmp_path,
        callbacks=[RunSummary(print_summary=False), Interrupt()],
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="step 3"):
        trainer.fit(TinyPolicy())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["steps"], summary["stopped_by"]) == (2, "RuntimeError")


def test_the_summary_counts_reward_errors_over_every_trajectory_and_prints_them_only_when_there_are_some():
    from thundersync_lightning.summary import format_summary

    def agg(step, n, errors):
        return StepAggregate(step, 0.0, n, n, 0, 2.0, 2.0, 1.0, 1, 1, reward_errors=errors)

    summary = summarize([agg(0, 4, 4), agg(1, 12, 0)], "streaming", 1.0)
    assert summary["reward_error_fraction"] == 4 / 16
    assert "reward errors          25.0% of trajectories" in format_summary(summary)
    clean = summarize([agg(0, 4, 0)], "streaming", 1.0)
    assert clean["reward_error_fraction"] == 0.0 and "reward errors" not in format_summary(clean)
    assert summarize([], "streaming", 0.0)["reward_error_fraction"] is None


def test_the_summary_counts_unscorable_trajectories_and_names_the_first_reward_error(tmp_path):
    from dataclasses import replace

    from tests.callbacks.helpers import record, stats
    from thundersync_lightning.callbacks import RunSummary
    from thundersync_lightning.summary import aggregate, format_summary

    row = "reset raised DatasetRowError: row 3 of 'rows.jsonl' has no value for mapped field(s) ['answer']"
    step = stats(
        [
            record(0, reward=1.0),
            replace(record(1, reward=0.0), unscorable=True),
            record(2, reward=0.0, finish="failure", failure=row),
            record(3, reward=0.0),
        ]
    )
    local = aggregate(step)
    assert (local.unscorable, local.reward_errors, local.reward_count) == (1, 1, 3)  # unscorable: no reward
    summary = summarize([local], "sync", 1.0)
    assert summary["unscorable_fraction"] == 0.25 and summary["reward_error_fraction"] == 0.25
    assert summary["reward_mean_first"] == 1 / 3
    assert "unscorable             25.0% of trajectories" in format_summary(summary)
    callback = RunSummary(path=str(tmp_path / "summary.json"))
    callback.measure(step)
    assert callback.summary("sync")["reward_error_first"] == row
