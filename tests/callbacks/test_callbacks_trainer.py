"""The monitors inside a real Lightning fit (a stand-in strategy publishes synthetic StepStats),
logged through CSV, TensorBoard and W&B offline, read back from the files."""

import csv
import glob
import json
import os

import lightning.pytorch as pl
import pytest
import yaml
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from tests.callbacks.helpers import StatsStrategy, TinyPolicy, record, stats
from tests.callbacks.wandb_offline import finish_wandb, read_offline_run
from thundersync_lightning.callbacks import (
    IdleTimeMonitor,
    MemoryMonitor,
    MFUMonitor,
    RolloutMetrics,
    RolloutProgressBar,
    StalenessMonitor,
    ThunderSyncWandbLogger,
    TrajectoryLogger,
    read_timeline,
)
from thundersync_lightning.callbacks.trajectories import TABLE_COLUMNS
from thundersync_lightning.strategy.stats import Interval, RolloutProgress


def step_stats(step, rank=0, world=1):
    t0 = 10.0 * step
    trajs = [
        record(i, step=step, version=step, tokens=4 + i, reward=float(i % 2), content_at=t0 + 1 + i)
        for i in range(4)
    ]
    busy = tuple(Interval(t0 + 1 + i, t0 + 1.5 + i, "backward") for i in range(4))
    return stats(trajs, step=step, version=step, start=t0, end=t0 + 8, busy=busy, learner_tokens=22)


class ProgressStrategy(StatsStrategy):
    """Also pushes one RolloutProgress per step to the callbacks that listen, as the real one does."""

    def training_step(self, *args, **kwargs):
        trainer = self.lightning_module.trainer
        progress = RolloutProgress(self._step, 4, 2, 1, 1, 3.0, 1.5)
        for cb in trainer.callbacks:
            if callable(getattr(cb, "on_rollout_progress", None)):
                cb.on_rollout_progress(trainer, self.lightning_module, progress)
        return super().training_step(*args, **kwargs)


def callbacks():
    return [
        StalenessMonitor(),
        MFUMonitor(peak_flops=1e6),
        MemoryMonitor(),
        IdleTimeMonitor(),
        RolloutMetrics(pass_threshold=1.0),
    ]


def fit(tmp_path, logger, extra=()):
    trainer = pl.Trainer(
        strategy=ProgressStrategy(step_stats),
        max_steps=2,
        logger=logger,
        callbacks=[*callbacks(), *extra],
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(TinyPolicy())
    return trainer


# step s: 4 trajectories of 4..7 tokens, rewards 0,1,0,1, staleness 0; 8 s steps, 2 s busy;
# flops = 6 * 56 * 22 + 48 * (16 + 25 + 36 + 49) = 7392 + 6048 = 13440; MFU = 13440 / (8 * 1e6)
EXPECTED = {
    "train/staleness_max_versions": 0.0,
    "perf/mfu": 13440 / 8e6,
    "perf/mfu_busy": 13440 / 2e6,
    "perf/learner_idle_fraction": 0.75,
    "perf/time_to_first_event_seconds": 1.0,
    "rollout/reward_mean": 0.5,
    "rollout/pass_rate": 0.5,
    "rollout/trajectories_count": 4.0,
}


def test_every_monitor_logs_every_step_to_csv_with_the_peak_source_as_a_hyperparameter(tmp_path):
    bar = RolloutProgressBar()
    trainer = fit(tmp_path, CSVLogger(tmp_path, name="csv"), extra=[bar])
    log_dir = trainer.logger.log_dir
    with open(os.path.join(log_dir, "metrics.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r["perf/mfu"]]
    assert [int(r["step"]) for r in rows] == [0, 1]
    for row in rows:
        for key, value in EXPECTED.items():
            assert float(row[key]) == pytest.approx(value, rel=1e-12), key
        assert float(row["memory/process_rss_bytes"]) > 0
    with open(os.path.join(log_dir, "hparams.yaml")) as f:
        assert yaml.safe_load(f)["perf/peak_flops_source"] == "explicit"
    timeline = read_timeline(os.path.join(log_dir, "timeline", "rank0.jsonl"))
    assert [r["step"] for r in timeline] == [0, 1]
    assert bar.rollout_progress == RolloutProgress(1, 4, 2, 1, 1, 3.0, 1.5)
    assert "traj=2/4" in bar.train_progress_bar.postfix


def test_the_monitors_work_with_tensorboard(tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoardLogger needs tensorboard (not a dependency)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = fit(tmp_path, TensorBoardLogger(tmp_path, name="tb"))
    (events,) = glob.glob(os.path.join(trainer.logger.log_dir, "events.out.tfevents.*"))
    acc = EventAccumulator(events)
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert set(EXPECTED) <= tags
    assert [e.value for e in acc.Scalars("train/staleness_max_versions")] == [0.0, 0.0]


def test_a_w_and_b_offline_run_read_back_from_its_files_holds_every_step(tmp_path):
    logger = ThunderSyncWandbLogger(save_dir=str(tmp_path), mode="offline", project="tests")
    fit(tmp_path, logger, extra=[TrajectoryLogger(num_per_step=2)])
    finish_wandb()
    run = read_offline_run(tmp_path)
    # the decoded trajectories as a table per step (its rows in a file beside the run)
    tables = [r for r in run["history"] if r.get("rollout/trajectories/_type") == "table-file"]
    assert [(r["trainer/global_step"], r["rollout/trajectories/nrows"]) for r in tables] == [(0, 2), (1, 2)]
    (files,) = (tmp_path / "wandb").glob("offline-run-*/files")
    table = json.loads((files / tables[1]["rollout/trajectories/path"]).read_text())
    assert table["columns"] == TABLE_COLUMNS
    assert [row[:3] for row in table["data"]] == [[1, "s1-g0-t0", 0.0], [1, "s1-g1-t0", 0.0]]
    rows = [r for r in run["history"] if "perf/mfu" in r]
    assert [r["trainer/global_step"] for r in rows] == [0, 1]  # Lightning logs step k at global_step - 1
    for row in rows:
        for key, value in EXPECTED.items():
            assert row[key] == pytest.approx(value, rel=1e-6), key
        assert 0 < row["perf/mfu"] <= 1
        assert row["memory/process_rss_bytes"] > 0
    assert run["config"]["perf/peak_flops_source"] == "explicit"


def test_the_default_callbacks_are_the_bar_every_monitor_trajectories_summary_and_checks_and_survive_pickling():  # noqa: E501
    import pickle

    from lightning.pytorch.callbacks import ModelCheckpoint

    from thundersync_lightning.callbacks import (
        InterruptCheckpoint,
        RunChecks,
        RunSummary,
        TrajectoryLogger,
        default_callbacks,
    )

    everything = default_callbacks()
    expected = [RolloutProgressBar, *[type(m) for m in callbacks()], TrajectoryLogger, RunSummary, RunChecks,
                ModelCheckpoint, InterruptCheckpoint]  # fmt: skip
    assert [type(m) for m in everything] == expected
    assert [type(m) for m in pickle.loads(pickle.dumps(everything))] == expected
    bare = default_callbacks(progress_bar=False, trajectories_per_step=0, checkpoint_every_n_steps=None)
    assert [type(m) for m in bare] == [type(m) for m in callbacks()] + [RunSummary, RunChecks]
