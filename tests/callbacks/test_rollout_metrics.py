import math
import warnings
from dataclasses import replace
from types import SimpleNamespace

import pytest

from tests.callbacks.helpers import StubModule, end_step, record, stats, stub_trainer
from thundersync_lightning.callbacks import RolloutMetrics


def test_rollout_metrics_of_one_step_against_a_hand_count():
    monitor, trainer, module = RolloutMetrics(pass_threshold=1.0), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")
    trajs = [
        record(0, reward=1.0, tokens=10, scored=4, turns=2),
        record(1, reward=0.0, tokens=20, scored=8, turns=4, finish="turn_limit"),
        record(2, reward=0.5, tokens=30, scored=6, turns=3, finish="length"),
        replace(
            record(
                3,
                reward=0.0,
                tokens=12,
                scored=0,
                turns=1,
                finish="failure",
                failure="step raised HostFault: sandbox host unix:///run/a.sock went away",
            ),
            host_fault=True,
        ),
    ]
    step = stats(trajs, groups_folded=2, groups_aborted=0, loss=-0.25, groups_generated=3, groups_filtered=1)
    end_step(monitor, trainer, module, step)
    # rewards 1, 0, 0.5, 0: mean 0.375; E[r^2] = 1.25 / 4 = 0.3125; var = 0.3125 - 0.140625 = 0.171875
    std = module.logged.pop("rollout/reward_std")
    assert math.isclose(std, math.sqrt(0.171875), rel_tol=1e-12)
    assert module.logged == {
        "rollout/reward_mean": 0.375,
        "rollout/pass_rate": 0.25,
        "rollout/trajectory_tokens_mean": 18.0,
        "rollout/scored_tokens_mean": 4.5,
        "rollout/turns_mean": 2.5,
        "rollout/trajectories_count": 4.0,
        "rollout/failures_count": 1.0,
        "rollout/host_faults_count": 1.0,  # included in the failures
        "rollout/failure_rate": 0.25,
        "rollout/reward_error_fraction": 0.0,  # the failure ended the episode: not the reward's
        "rollout/unscorable_fraction": 0.0,
        "rollout/invalid_tool_call_fraction": 0.0,  # no tool calls
        "rollout/truncated_action_fraction": 0.0,  # every action ended its turn
        "rollout/tool_error_fraction": 0.0,
        "rollout/tool_timeout_fraction": 0.0,
        "rollout/groups_folded_count": 2.0,
        "rollout/groups_aborted_count": 0.0,
        "rollout/groups_generated_count": 3.0,
        "rollout/groups_kept_count": 2.0,
        "rollout/groups_dropped_count": 1.0,
        "rollout/finish_submit_count": 1.0,
        "rollout/finish_turn_limit_count": 1.0,
        "rollout/finish_length_count": 1.0,
        "rollout/finish_failure_count": 1.0,
        "train/loss": -0.25,
        "train/zero_advantage_group_fraction": 0.0,  # groups (1, 0) and (0.5, 0) both vary
    }


def test_a_step_whose_rewards_are_all_unknown_leaves_the_reward_keys_out():
    monitor, trainer, module = RolloutMetrics(), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")
    end_step(monitor, trainer, module, stats([record(0, reward=None)]))
    assert "rollout/reward_mean" not in module.logged and "rollout/pass_rate" not in module.logged
    assert module.logged["rollout/trajectories_count"] == 1.0


def test_metrics_are_reset_between_steps():
    monitor, trainer, module = RolloutMetrics(), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")
    end_step(monitor, trainer, module, stats([record(0, reward=1.0)], step=0))
    end_step(monitor, trainer, module, stats([record(0, reward=0.0, step=1)], step=1))
    assert module.logged["rollout/reward_mean"] == 0.0 and module.logged["rollout/trajectories_count"] == 1.0


def test_groups_with_equal_rewards_are_counted_as_zero_advantage():
    monitor, trainer, module = RolloutMetrics(), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")
    # groups of two (record i is in group i // 2): (1, 1) equal, (0, 1) not, (0,
    # 0) equal, (None, 1) one reward
    rewards = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, None, 1.0]
    end_step(monitor, trainer, module, stats([record(i, reward=r) for i, r in enumerate(rewards)]))
    assert module.logged["train/zero_advantage_group_fraction"] == 3 / 4


def test_a_run_with_only_equal_reward_groups_for_many_steps_warns_once():
    monitor, trainer, module = RolloutMetrics(zero_advantage_warn_steps=3), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")

    def step(k, varied=False):
        trajs = [record(i, step=k, reward=float(varied and i == 0)) for i in range(4)]
        end_step(monitor, trainer, module, stats(trajs, step=k))

    step(0)
    step(1, varied=True)  # breaks the streak
    step(2)
    step(3)
    with pytest.warns(UserWarning, match="3 consecutive steps every group had equal rewards"):
        step(4)
    assert module.logged["train/zero_advantage_group_fraction"] == 1.0


def test_the_invalid_tool_call_fraction_is_malformed_calls_over_all_calls_of_the_step():
    from dataclasses import replace

    monitor, trainer, module = RolloutMetrics(), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")
    trajs = [
        replace(record(0), tool_calls=3, invalid_tool_calls=1),
        replace(record(1), tool_calls=1),
        record(2),
    ]
    end_step(monitor, trainer, module, stats(trajs))
    assert module.logged["rollout/invalid_tool_call_fraction"] == 0.25  # 1 malformed of 4 calls


def test_the_truncated_action_fraction_is_actions_that_never_ended_their_turn_over_all_actions():
    from dataclasses import replace

    monitor, trainer, module = RolloutMetrics(), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")
    trajs = [
        replace(record(0, turns=3), truncated_actions=2),
        replace(record(1, turns=1), truncated_actions=1),
        record(2, turns=4),
    ]
    end_step(monitor, trainer, module, stats(trajs))
    assert module.logged["rollout/truncated_action_fraction"] == 3 / 8  # 2 + 1 of 3 + 1 + 4 actions


def test_reward_errors_are_counted_per_step_and_the_first_step_above_the_threshold_warns_with_the_error():
    monitor, trainer, module = RolloutMetrics(reward_error_warn_fraction=0.3), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")
    wrong_signature = (
        "verdict raised RewardError: reward 'mine:score' raised TypeError: "
        "score() takes 1 positional argument"
    )
    trajs = [
        record(0, reward=0.0, failure=wrong_signature),  # a verdict that raised: the episode itself finished
        record(
            1, reward=0.0, finish="failure", failure=wrong_signature.replace("verdict", "step")
        ),  # grading a turn
        record(2, reward=0.0, finish="failure", failure="TimeoutError: step timed out"),  # the environment's
        record(3, reward=1.0),
    ]
    end_step(monitor, trainer, module, stats(trajs[2:], step=0))  # no reward error: no warning
    assert module.logged["rollout/reward_error_fraction"] == 0.0
    with pytest.warns(UserWarning, match=r"Step 1: the reward of 50% .*TypeError: score\(\) takes 1"):
        end_step(monitor, trainer, module, stats(trajs, step=1))
    assert module.logged["rollout/reward_error_fraction"] == 0.5  # 2 of 4
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once
        end_step(monitor, trainer, module, stats(trajs, step=2))


def test_the_reward_error_threshold_must_be_a_fraction():
    with pytest.raises(ValueError, match="reward_error_warn_fraction"):
        RolloutMetrics(reward_error_warn_fraction=1.5)


def test_tool_errors_and_timeouts_are_fractions_of_the_calls_and_each_kind_warns_once_with_its_reason():
    monitor, trainer, module = RolloutMetrics(), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")
    # 8 calls: 1 malformed, 2 raised, 1 timed out (tool_errors counts the timed-out call too)
    trajs = [
        replace(
            record(0),
            tool_calls=5,
            invalid_tool_calls=1,
            tool_errors=2,
            tool_error="add raised ValueError: x",
        ),
        replace(
            record(1),
            tool_calls=3,
            tool_errors=1,
            tool_timeouts=1,
            tool_error="wait did not return within 1 s",
        ),
    ]
    with pytest.warns(UserWarning) as caught:
        end_step(monitor, trainer, module, stats(trajs))
    assert module.logged["rollout/tool_error_fraction"] == 2 / 8
    assert module.logged["rollout/tool_timeout_fraction"] == 1 / 8
    assert module.logged["rollout/invalid_tool_call_fraction"] == 1 / 8
    raised, timed_out = (
        next(str(w.message) for w in caught if kind in str(w.message))
        for kind in ("calls raised", "calls timed out")
    )
    assert "25% of the tool calls raised" in raised and "add raised ValueError: x" in raised
    assert "12% of the tool calls timed out" in timed_out and "wait did not return within 1 s" in timed_out
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per kind: the next step is counted, not warned
        end_step(monitor, trainer, module, stats(trajs, step=1))


def test_each_named_reward_of_the_task_source_is_logged_unweighted():
    monitor, module = RolloutMetrics(), StubModule()
    trainer = stub_trainer(
        datamodule=SimpleNamespace(tasks=SimpleNamespace(reward_names=("correct", "brief")))
    )
    monitor.setup(trainer, module, "fit")
    trajs = [
        replace(record(0, reward=1.5), reward_parts=(("correct", 1.0), ("brief", 1.0))),
        replace(record(1, reward=0.5), reward_parts=(("correct", 0.0), ("brief", 1.0))),
        record(2, reward=0.0, finish="failure", failure="row 2 has no value"),
    ]  # no parts: counted in neither
    end_step(monitor, trainer, module, stats(trajs))
    assert module.logged["rollout/reward/correct_mean"] == 0.5
    assert module.logged["rollout/reward/brief_mean"] == 1.0


def test_a_reward_mean_averages_every_trajectory_where_that_reward_gave_a_value():
    """TRL's nanmean per reward: a trajectory failed by another reward, or declined (None) by this
    one, still counts for the rewards that scored it."""
    monitor, module = RolloutMetrics(), StubModule()
    trainer = stub_trainer(datamodule=SimpleNamespace(tasks=SimpleNamespace(reward_names=("fmt", "correct"))))
    monitor.setup(trainer, module, "fit")
    failed = "RewardError: reward 'correct' raised KeyError: 'answer'"
    trajs = [
        replace(record(0, reward=1.0), reward_parts=(("fmt", 1.0),)),  # correct declined (None)
        replace(record(1, reward=0.0, failure=failed), reward_parts=(("fmt", 1.0),)),  # correct raised
        replace(record(2, reward=1.0), reward_parts=(("fmt", 0.0), ("correct", 1.0))),
    ]
    with pytest.warns(UserWarning, match="could not be computed"):
        end_step(monitor, trainer, module, stats(trajs))
    assert module.logged["rollout/reward/fmt_mean"] == 2 / 3  # all three gave fmt a value
    assert module.logged["rollout/reward/correct_mean"] == 1.0  # only the third scored correct


def test_unscorable_trajectories_are_a_fraction_left_out_of_the_reward_mean_and_warned_once():
    monitor, trainer, module = RolloutMetrics(), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")
    trajs = [
        record(0, reward=1.0),
        replace(record(1, reward=0.0), unscorable=True),
        record(2, reward=0.0),
        record(3, reward=1.0),
    ]
    with pytest.warns(
        UserWarning, match=r"Step 0: every reward returned None for 25% .*rollout/unscorable_fraction"
    ):
        end_step(monitor, trainer, module, stats(trajs))
    assert module.logged["rollout/unscorable_fraction"] == 0.25
    assert module.logged["rollout/reward_mean"] == 2 / 3  # the unscorable one's 0.0 is no reward
    assert module.logged["rollout/reward_error_fraction"] == 0.0  # declining is not failing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        end_step(monitor, trainer, module, stats(trajs, step=1))


def test_a_row_failing_at_reset_is_a_reward_error_warned_with_the_row_whatever_its_share():
    monitor, trainer, module = RolloutMetrics(reward_error_warn_fraction=0.5), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")
    row = "reset raised DatasetRowError: row 7 of 'rows.jsonl' has no value for mapped field(s) ['answer']"
    trajs = [
        replace(record(0, reward=0.0, finish="failure", failure=row, turns=0), host_fault=True),
        record(1),
        record(2),
        record(3),
    ]
    with pytest.warns(
        UserWarning, match=r"a data row failed at reset .*row 7 of 'rows.jsonl' has no value"
    ) as caught:
        end_step(monitor, trainer, module, stats(trajs))
    assert len(caught) == 1  # 25%: under the reward-error threshold, but a bad row is always said once
    assert module.logged["rollout/reward_error_fraction"] == 0.25
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        end_step(monitor, trainer, module, stats(trajs, step=1))
