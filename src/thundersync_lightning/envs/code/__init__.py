"""Local code tasks: small repositories shipped as YAML (:mod:`.task`), each episode in a
bubblewrap workspace on the host (:mod:`.workspace`), graded with the shared repository toolkit
(:mod:`..repo`: the episode, the trusted pytest run, swebench's report)."""

from typing import Any

from ...core.moved_modules import moved_name
from .source import LocalCodeTasks, SplitLocalCodeTasks
from .task import LocalTask, load_task, load_tasks, shipped_tasks_dir
from .workspace import LocalWorkspace, WorkspaceSettings

__all__ = [
    "LocalCodeTasks",
    "SplitLocalCodeTasks",
    "LocalTask",
    "load_task",
    "load_tasks",
    "shipped_tasks_dir",
    "LocalWorkspace",
    "WorkspaceSettings",
]


def __getattr__(name: str) -> Any:
    return moved_name(__name__, name)  # the toolkit's names this package re-exported (deprecated)
