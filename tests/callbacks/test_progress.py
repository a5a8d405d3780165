from tests.callbacks.helpers import stub_trainer
from thundersync_lightning.callbacks import RolloutProgressBar
from thundersync_lightning.callbacks.progress import progress_items
from thundersync_lightning.strategy.stats import RolloutProgress

PROGRESS = RolloutProgress(
    step=3, trajectories_total=32, content_ready=12, reward_ready=10, open_groups=3,
    elapsed_seconds=4.0, idle_seconds=1.0,
)  # fmt: skip


def test_progress_items_show_trajectories_rewards_open_groups_and_idle():
    assert progress_items(PROGRESS) == {"traj": "12/32", "rew": "10/32", "open": 3, "idle": "1.0s (25%)"}


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
        "train/loss": 0.5, "traj": "12/32", "rew": "10/32", "open": 3, "idle": "1.0s (25%)",
    }  # fmt: skip
