"""Generated bug-fix tasks a tiny model learns from scratch on CPU, through the real sandbox.

See :mod:`.generate` (how tasks are made), :mod:`.env` (the action language and the sandboxed,
swebench-graded verdict) and :mod:`.source` (the task source and its held-out split).
"""

from ..mutation_sites import mutate, sites
from .corpus import SEEDS, Seed
from .env import ActionVocab, MutationEnv, parse_results, test_script
from .generate import MutationTask, generate_tasks
from .source import MutationTasks, is_held_out

__all__ = [
    "SEEDS",
    "Seed",
    "ActionVocab",
    "MutationEnv",
    "parse_results",
    "test_script",
    "MutationTask",
    "generate_tasks",
    "mutate",
    "sites",
    "MutationTasks",
    "is_held_out",
]
