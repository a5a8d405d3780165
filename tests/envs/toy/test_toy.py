"""The guessing game: rules, verifier, reproducible tasks and simulated latency, model spec."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.core.protocols import Environment, TaskSource
from thundersync_lightning.envs.toy import GuessingGameEnv, GuessingGameTasks
from thundersync_lightning.rollout import build_model


def play(env: GuessingGameEnv, policy) -> float:
    """Run an episode with ``policy(history) -> token`` and return the verdict."""
    history = list(env.reset())
    for _ in range(env.max_turns):
        action = policy(history)
        result = env.step((action,))
        history.append(action)
        history.extend(result.observation)
        if result.done:
            break
    return env.verdict()


def binary_search(num_digits: int):
    def policy(history: list[int]) -> int:
        lo, hi = 0, num_digits - 1
        for guess, answer in zip(history[1::2], history[2::2]):
            if answer == num_digits:  # HIGHER
                lo = guess + 1
            elif answer == num_digits + 1:  # LOWER
                hi = guess - 1
        return (lo + hi) // 2

    return policy


def test_the_environment_answers_higher_lower_ok_and_bad():
    env = GuessingGameEnv(secret=6, num_digits=10, max_turns=4)
    assert tuple(env.reset()) == (env.start,)
    assert env.step((3,)).observation == (env.higher,)
    assert env.step((8,)).observation == (env.lower,)
    assert env.step((env.start,)).observation == (env.bad,)
    result = env.step((6,))
    assert result.observation == (env.ok,) and result.done
    assert env.verdict() == 1.0


def test_the_verifier_gives_zero_when_the_secret_was_not_found():
    env = GuessingGameEnv(secret=9, num_digits=10, max_turns=2)
    assert play(env, lambda history: 0) == 0.0


@pytest.mark.parametrize("num_digits", [8, 10, 15])
def test_binary_search_finds_every_secret_within_four_turns(num_digits):
    for secret in range(num_digits):
        env = GuessingGameEnv(secret=secret, num_digits=num_digits, max_turns=4)
        assert play(env, binary_search(num_digits)) == 1.0


def test_a_random_policy_wins_well_below_the_learning_target():
    gen = torch.Generator().manual_seed(0)
    tasks = GuessingGameTasks(latency="none")
    wins = [
        play(
            tasks.make_env(task, seed),
            lambda h: int(torch.randint(0, tasks.vocab_size + 1, (), generator=gen)),
        )
        for seed, task in enumerate(tasks.tasks(step=0, num_groups=400, seed=0))
    ]
    assert statistics.mean(wins) <= 0.3


def test_tasks_depend_on_seed_step_and_group_only():
    tasks = GuessingGameTasks()
    assert tasks.tasks(3, 16, seed=1)[:4] == tasks.tasks(3, 4, seed=1)
    assert tasks.tasks(3, 16, seed=1) != tasks.tasks(4, 16, seed=1)
    assert {t.secret for t in tasks.tasks(0, 200, seed=0)} == set(range(tasks.num_digits))


def test_the_simulated_latency_is_reproducible_long_tailed_and_capped():
    tasks = GuessingGameTasks(latency_median_s=0.03, latency_sigma=1.0, latency_max_s=1.0)
    draws = [tasks.sample_latency(seed) for seed in range(4000)]
    assert draws == [tasks.sample_latency(seed) for seed in range(4000)]
    assert statistics.median(draws) == pytest.approx(0.03, rel=0.1)
    assert max(draws) == 1.0 and max(draws) > 20 * statistics.median(draws)
    pareto = GuessingGameTasks(latency="pareto", latency_median_s=0.03, latency_pareto_alpha=1.5)
    assert statistics.median(pareto.sample_latency(s) for s in range(4000)) == pytest.approx(0.03, rel=0.1)
    assert GuessingGameTasks(latency="none").sample_latency(1) == 0.0


def test_the_task_source_and_environment_satisfy_the_protocols():
    tasks = GuessingGameTasks()
    assert isinstance(tasks, TaskSource)
    assert isinstance(tasks.make_env(tasks.tasks(0, 1, 0)[0], seed=0), Environment)
    assert (tasks.max_action_tokens, tasks.stop_token) == (1, None)


def test_invalid_settings_are_reported_together():
    with pytest.raises(ConfigError) as err:
        GuessingGameTasks(num_digits=1, max_turns=0, latency="uniform")
    assert all(name in str(err.value) for name in ("num_digits", "max_turns", "latency"))


def test_the_model_spec_builds_a_tiny_qwen3_with_head_dim_64_covering_the_vocabulary():
    tasks = GuessingGameTasks()
    model = build_model(tasks.model_spec())
    assert model.config.model_type == "qwen3" and model.config.head_dim == 64
    assert model.config.vocab_size >= tasks.vocab_size
    assert sum(p.numel() for p in model.parameters()) < 300_000
    assert math.isfinite(model(input_ids=torch.tensor([[tasks.num_digits + 4]])).logits.sum().item())


def test_context_tokens_lengthen_the_prompt_and_the_positions_but_not_the_game():
    tasks = GuessingGameTasks(context_tokens=100, latency="none")
    env = tasks.make_env(tasks.tasks(0, 1, 0)[0], seed=0)
    prompt = tuple(env.reset())
    assert prompt == (env.start,) * 101
    assert tasks.max_episode_tokens() == GuessingGameTasks().max_episode_tokens() + 100
    positions = tasks.model_spec().config["max_position_embeddings"]
    assert positions >= tasks.max_episode_tokens() and positions % 64 == 0
    assert GuessingGameTasks().model_spec().config["max_position_embeddings"] == 64
    # the rules after the context: binary search still wins every secret
    assert play(env, lambda history: binary_search(8)(history[100:])) == 1.0
    with pytest.raises(ConfigError, match="context_tokens"):
        GuessingGameTasks(context_tokens=-1)
