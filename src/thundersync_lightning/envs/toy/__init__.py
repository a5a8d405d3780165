"""The guessing game: a learnable toy agent task (the source and its rules: :mod:`.source`)."""

from .env import GuessingGameEnv, GuessingTask
from .source import GuessingGameTasks, toy_model_spec

__all__ = ["GuessingTask", "GuessingGameEnv", "GuessingGameTasks", "toy_model_spec"]
