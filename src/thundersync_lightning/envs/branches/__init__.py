"""Branch requests: a tiny model learns on CPU to serve a request only a correct tool call can.

See :mod:`.tasks` (the task, its tools, the verdict and the held-out split) and :mod:`.start`
(the tokenizer, chat template and format-only pretrained starting policy).
"""

from .tasks import (
    BRANCHES,
    PHRASES,
    VERBS,
    BranchEnv,
    BranchRepo,
    BranchTask,
    BranchTasks,
    all_branch_tasks,
    branch_tools,
    expected_state,
    is_held_out,
)

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
