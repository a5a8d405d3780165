"""What the families that fix a Python repository share (``code``, ``swebench``; ``mutations``
grades and offers tools with it): the episode (:mod:`.episode`: prompt, actions in :mod:`.actions`
or tool calls of :mod:`.tools`, bounded observations, the verdict over any ``Workspace``) and
the trusted grading of a pytest run (:mod:`.runner` and :mod:`.reporter`: the host's runner and
its authenticated result lines; :mod:`.outcomes`: a graded test passes only if it ran and passed;
:mod:`.grading`: swebench's report on the host-framed log; :mod:`.patches`: the agent's patch,
captured and filtered; :mod:`.pytest_config`: the files that configure a pytest run, protected).

A family keeps its own tasks, task source and workspace (where the repository lives: bubblewrap
on the host, a container image) and imports these; no family imports another's package.
"""

from .actions import ACTION_HELP, Bash, Invalid, ReplaceInFile, Submit, WriteFile, parse_action
from .episode import ActionFormat, CodeEnv, Workspace, format_observation, render_prompt
from .grading import EvalOutcome, grade_log, grade_with_spec
from .patches import filter_patch, patch_paths, split_patch
from .pytest_config import is_protected_path
from .tools import code_episode_tokens, swe_tools, tool_conversation, tool_renderer

__all__ = [
    "ACTION_HELP",
    "Bash",
    "Invalid",
    "ReplaceInFile",
    "Submit",
    "WriteFile",
    "parse_action",
    "ActionFormat",
    "CodeEnv",
    "Workspace",
    "format_observation",
    "render_prompt",
    "EvalOutcome",
    "grade_log",
    "grade_with_spec",
    "filter_patch",
    "patch_paths",
    "split_patch",
    "is_protected_path",
    "code_episode_tokens",
    "swe_tools",
    "tool_conversation",
    "tool_renderer",
]
