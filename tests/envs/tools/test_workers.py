"""Worker processes: replies are JSON, a reward's value comes back as plain data, a coroutine's
value is awaited, and a worker imports exactly the function it was given (wrappers too)."""

from __future__ import annotations

import pytest

from thundersync_lightning.envs.datasets.rewards import call_reward, resolve_reward
from thundersync_lightning.envs.tools.workers import ToolWorkers, worker_path

from .. import user_rewards


@pytest.fixture
def workers():  # noqa: ANN201
    pool = ToolWorkers()
    yield pool
    pool.close()


def test_a_reward_value_comes_back_as_plain_data_and_a_coroutine_is_awaited(workers) -> None:
    path = worker_path(user_rewards.later)
    assert path == "tests.envs.user_rewards:later"
    assert workers.exchange(path, ("p", "c"), {}, 30.0, None) == ("ok", 0.25)
    assert workers.exchange("tests.envs.user_rewards:length", ("p", "abc"), {}, 30.0, None) == ("ok", 3.0)


def test_a_value_that_is_not_plain_data_is_named_not_unpickled(workers) -> None:
    status, why = workers.exchange("builtins:object", (), {}, 30.0, None)
    assert status == "value" and "object" in why


def test_a_wrapper_is_imported_by_the_name_it_is_bound_to_not_the_wrapped_functions() -> None:
    assert user_rewards.doubled_length.__qualname__ == "length"
    assert worker_path(user_rewards.doubled_length) == "tests.envs.user_rewards:doubled_length"
    reward = resolve_reward(user_rewards.doubled_length)
    assert call_reward(reward, "p", "abcd", {}) == 8.0  # through the worker: the wrapper, not length (4.0)
    assert worker_path(lambda p, c: 1.0) is None
