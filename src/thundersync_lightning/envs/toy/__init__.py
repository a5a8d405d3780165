"""The guessing game: a learnable toy agent task (the source and its rules: :mod:`.source`)."""

from ..tiny_model import toy_model_spec
from .env import GuessingGameEnv, GuessingTask
from .source import GuessingGameTasks

__all__ = ["GuessingTask", "GuessingGameEnv", "GuessingGameTasks", "toy_model_spec"]
