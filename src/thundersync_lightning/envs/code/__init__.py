"""Code environments: local repository tasks in bubblewrap, graded with swebench's functions."""

from ..codec import ByteCodec, HFTokenizerCodec, TextCodec
from .actions import ACTION_HELP, Bash, Invalid, ReplaceInFile, Submit, WriteFile, parse_action
from .env import CodeEnv, Workspace, format_observation, render_prompt
from .grading import EvalOutcome, filter_patch, grade_log, split_patch
from .patches import patch_paths
from .source import LocalCodeTasks, SplitLocalCodeTasks
from .task import LocalTask, is_protected_path, load_task, load_tasks, shipped_tasks_dir
from .tools import swe_tools
from .workspace import LocalWorkspace, WorkspaceSettings

__all__ = [
    "ACTION_HELP",
    "Bash",
    "Invalid",
    "ReplaceInFile",
    "Submit",
    "WriteFile",
    "parse_action",
    "ByteCodec",
    "HFTokenizerCodec",
    "TextCodec",
    "CodeEnv",
    "Workspace",
    "format_observation",
    "render_prompt",
    "EvalOutcome",
    "filter_patch",
    "grade_log",
    "split_patch",
    "patch_paths",
    "LocalCodeTasks",
    "SplitLocalCodeTasks",
    "LocalTask",
    "is_protected_path",
    "load_task",
    "load_tasks",
    "shipped_tasks_dir",
    "LocalWorkspace",
    "WorkspaceSettings",
    "swe_tools",
]
