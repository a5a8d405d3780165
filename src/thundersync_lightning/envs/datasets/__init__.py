"""Bring your own prompts and rewards: a task source over ``datasets`` files and a reward registry."""

from .env import DatasetEnv, DatasetTask
from .rewards import (
    RewardError,
    call_reward,
    exact_match,
    get_reward,
    math_answer,
    regex_match,
    register_reward,
    resolve_reward,
    reward_names,
    unit_tests,
)
from .source import DatasetTasks, load_rows

__all__ = [
    "RewardError",
    "call_reward",
    "exact_match",
    "get_reward",
    "math_answer",
    "regex_match",
    "register_reward",
    "resolve_reward",
    "reward_names",
    "unit_tests",
    "DatasetEnv",
    "DatasetTask",
    "DatasetTasks",
    "load_rows",
]
