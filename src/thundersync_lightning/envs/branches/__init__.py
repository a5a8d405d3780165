"""Branch requests: a tiny model learns on CPU to serve a request only a correct tool call can.

See :mod:`.env` (the request, its repository, tools and verdict), :mod:`.source` (the task source
and the held-out split) and :mod:`.start` (the tokenizer, chat template and
format-only pretrained starting policy).
"""

from .env import BRANCHES, PHRASES, VERBS, BranchEnv, BranchRepo, BranchTask, branch_tools, expected_state
from .source import BranchTasks, all_branch_tasks, is_held_out

__all__ = [
    "BRANCHES",
    "PHRASES",
    "VERBS",
    "BranchEnv",
    "BranchRepo",
    "BranchTask",
    "BranchTasks",
    "all_branch_tasks",
    "branch_tools",
    "expected_state",
    "is_held_out",
]
