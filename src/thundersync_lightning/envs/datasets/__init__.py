"""Bring your own prompts, rewards and tools: a task source over ``datasets`` files, a reward registry."""

from .conventions import CONVENTIONS, RewardConvention, RewardInput
from .env import DatasetEnv, DatasetTask
from .reward_sum import RewardSum
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
from .rows import DatasetRowError, Rows, read_rows
from .source import DatasetTasks, load_rows
from .tool_env import DatasetToolEnv

__all__ = [
    "CONVENTIONS",
    "DatasetRowError",
    "RewardConvention",
    "RewardInput",
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
    "DatasetToolEnv",
    "RewardSum",
    "Rows",
    "read_rows",
]
