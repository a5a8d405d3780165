"""A metric is one method: StepStatsCallback does the hook, the reduction over ranks and the logging."""

from __future__ import annotations

import pytest

from tests.callbacks.helpers import StubModule, end_step, record, stats, stub_trainer
from thundersync_lightning.callbacks import Max, Mean, StepStatsCallback, Sum


class LongestTrajectory(StepStatsCallback):
    def measure(self, stats):
        return {"rollout/longest_trajectory_tokens": Max([t.num_tokens for t in stats.trajectories])}


class TokensPerTurn(StepStatsCallback):
    """A ratio of two sums over ranks: intermediates without a namespace are reduced, not logged."""

    def measure(self, stats):
        trajs = stats.trajectories
        return {
            "tokens": Sum(sum(t.num_tokens for t in trajs)),
            "turns": Sum(sum(t.num_turns for t in trajs)),
        }

    def derive(self, reduced, stats):
        return {"rollout/tokens_per_turn": reduced["tokens"] / reduced["turns"]}


def test_a_monitor_written_as_one_method_logs_its_metric_at_every_step():
    monitor, trainer, module = LongestTrajectory(), stub_trainer(), StubModule()
    end_step(monitor, trainer, module, stats((record(0, tokens=10), record(1, tokens=30))))
    assert module.logged == {"rollout/longest_trajectory_tokens": 30.0}
    assert monitor.last_metrics == {"rollout/longest_trajectory_tokens": 30.0}
    end_step(monitor, trainer, module, stats((record(0, tokens=7, step=1),), step=1))
    assert module.logged == {"rollout/longest_trajectory_tokens": 7.0}  # reset between steps


def test_intermediate_names_are_reduced_but_only_the_derived_value_is_logged():
    monitor, trainer, module = TokensPerTurn(), stub_trainer(), StubModule()
    end_step(monitor, trainer, module, stats((record(0, tokens=10, turns=2), record(1, tokens=20, turns=4))))
    # (10 + 20) / (2 + 4): the ratio of the sums, not the mean of the ratios
    assert module.logged == {"rollout/tokens_per_turn": 5.0}


def test_a_weighted_mean_counts_each_value_by_its_weight():
    class Weighted(StepStatsCallback):
        def measure(self, stats):
            return {"rollout/weighted": Mean([1.0, 4.0], weight=3.0)}

    monitor, trainer, module = Weighted(), stub_trainer(), StubModule()
    end_step(monitor, trainer, module, stats((record(0),)))
    assert module.logged == {"rollout/weighted": 2.5}


def test_a_monitor_whose_names_change_between_steps_is_refused():
    class Drifting(StepStatsCallback):
        def measure(self, stats):
            return {f"rollout/step_{stats.step}": Sum(1.0)}

    monitor, trainer, module = Drifting(), stub_trainer(), StubModule()
    end_step(monitor, trainer, module, stats((record(0),), step=0))
    with pytest.raises(ValueError, match="must return the same ones"):
        end_step(monitor, trainer, module, stats((record(0, step=1),), step=1))
