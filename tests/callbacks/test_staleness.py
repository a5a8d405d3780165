import pytest

from tests.callbacks.helpers import StubModule, end_step, record, stats, stub_trainer
from thundersync_lightning.callbacks import StalenessMonitor
from thundersync_lightning.core.errors import StalenessError


def test_async_staleness_is_logged_as_mean_max_and_histogram():
    monitor, trainer, module = StalenessMonitor(), stub_trainer(), StubModule()
    trajs = [record(0, staleness=0), record(1, staleness=1), record(2, staleness=1), record(3, staleness=3)]
    end_step(monitor, trainer, module, stats(trajs, mode="async", version=5))
    # staleness 0, 1, 1, 3: mean 5/4, max 3, three stale; buckets 0 | 1 | 2+ hold 1 | 2 | 1
    assert module.logged == {
        "train/staleness_mean_versions": 1.25,
        "train/staleness_max_versions": 3.0,
        "train/stale_trajectories_count": 3.0,
        "train/staleness_0_versions_count": 1.0,
        "train/staleness_1_versions_count": 2.0,
        "train/staleness_2plus_versions_count": 1.0,
    }


def test_streaming_raises_at_the_first_stale_trajectory_naming_its_id_and_versions():
    monitor, trainer, module = StalenessMonitor(), stub_trainer(), StubModule()
    trajs = [
        record(0, step=7, version=7, content_at=100.5),
        record(1, step=7, version=7, staleness=2, content_at=101.5),
        record(2, step=7, version=7, staleness=1, content_at=100.9),  # the first stale to arrive
    ]
    with pytest.raises(StalenessError) as err:
        end_step(monitor, trainer, module, stats(trajs, step=7, version=7, mode="streaming"))
    message = str(err.value)
    assert "s7-g1-t0" in message and "version 6" in message and "updates version 7" in message
    assert "require_zero=False" in message
    assert module.logged["train/stale_trajectories_count"] == 2.0  # logged before raising


@pytest.mark.parametrize("mode", ["streaming", "sync"])
def test_zero_staleness_passes_in_on_policy_modes(mode):
    monitor, trainer, module = StalenessMonitor(), stub_trainer(), StubModule()
    end_step(monitor, trainer, module, stats([record(0), record(1)], mode=mode))
    assert module.logged["train/staleness_max_versions"] == 0.0
    assert module.logged["train/staleness_0_versions_count"] == 2.0


def test_require_zero_defaults_follow_the_mode_and_can_be_overridden():
    stale = [record(0, staleness=1, version=1)]
    end_step(StalenessMonitor(), stub_trainer(), StubModule(), stats(stale, mode="async", version=1))
    end_step(
        StalenessMonitor(require_zero=False),
        stub_trainer(),
        StubModule(),
        stats(stale, mode="sync", version=1),
    )
    with pytest.raises(StalenessError):
        end_step(
            StalenessMonitor(require_zero=True),
            stub_trainer(),
            StubModule(),
            stats(stale, mode="async", version=1),
        )


def test_a_step_is_logged_once_even_if_the_batch_end_hook_sees_the_same_stats_twice():
    monitor, trainer, module = StalenessMonitor(), stub_trainer(), StubModule()
    step = stats([record(0)], mode="sync")
    end_step(monitor, trainer, module, step)
    module.logged.clear()
    end_step(monitor, trainer, module, step)
    assert module.logged == {}


def test_strategies_without_step_stats_log_nothing():
    from types import SimpleNamespace

    module = StubModule()
    StalenessMonitor().on_train_batch_end(stub_trainer(strategy=SimpleNamespace()), module, None, None, 0)
    assert module.logged == {}
