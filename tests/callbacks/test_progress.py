import lightning.pytorch as pl

from tests.callbacks.helpers import StatsStrategy, TinyPolicy, record, stats, stub_trainer
from thundersync_lightning.callbacks import RolloutProgressBar
from thundersync_lightning.callbacks.progress import progress_items, step_line
from thundersync_lightning.strategy.stats import RolloutProgress

PROGRESS = RolloutProgress(
    step=3, trajectories_total=32, content_ready=12, reward_ready=10, open_groups=3,
    elapsed_seconds=4.0, idle_seconds=1.0,
)  # fmt: skip


def test_progress_items_show_trajectories_rewards_open_groups_and_idle():
    assert progress_items(PROGRESS) == {"traj": "12/32", "verdicts": "10/32", "open": 3, "idle": "1.0s (25%)"}


def test_the_bar_keeps_the_latest_report_and_adds_it_to_its_postfix():
    class Bar:
        def __init__(self):
            self.postfix = None

        def set_postfix(self, items, refresh=True):
            self.postfix = items

    bar = RolloutProgressBar()
    trainer = stub_trainer(progress_bar_metrics={"train/loss": 0.5}, loggers=[])
    bar.on_rollout_progress(trainer, None, PROGRESS)  # outside the loop: kept, nothing drawn
    assert bar.rollout_progress == PROGRESS
    bar.train_progress_bar = Bar()
    bar.on_rollout_progress(trainer, None, PROGRESS)
    assert bar.train_progress_bar.postfix == {
        "train/loss": 0.5, "traj": "12/32", "verdicts": "10/32", "open": 3, "idle": "1.0s (25%)",
    }  # fmt: skip


def _step(step, rank=0, world=1):
    trajs = [record(i, step=step, reward=float(i < step + 1)) for i in range(4)]  # 1/4 then 2/4 rewarded
    return stats(trajs, step=step, start=0.0, end=2.0, loss=-0.5)


def test_the_line_for_a_step_numbers_it_from_0_counts_done_steps_and_shows_its_mean_reward():
    assert step_line(_step(1), max_steps=10) == (
        "step 1 (2/10)  reward=0.500  loss=-0.5  trajectories=4  idle=2.0s (100%)  staleness=0  step=2.00s"
    )


def test_without_a_terminal_the_bar_prints_one_line_per_step_and_keeps_the_last_reward(tmp_path, capsys):
    bar = RolloutProgressBar()  # pytest captures stdout: not a tty, so line mode
    assert bar.line_mode
    trainer = pl.Trainer(
        strategy=StatsStrategy(_step), max_steps=2, logger=False, callbacks=[bar], log_every_n_steps=1,
        enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(TinyPolicy())
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split("  ")[:2] for line in lines] == [
        ["step 0 (1/2)", "reward=0.250"],  # numbered from 0 as in trajectories.jsonl and show
        ["step 1 (2/2)", "reward=0.500"],
    ]
    assert bar.last_reward == 0.5
    assert "\r" not in capsys.readouterr().out
