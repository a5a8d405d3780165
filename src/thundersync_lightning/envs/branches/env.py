"""One branch-request episode: the request, the host-side repository,
the three branch tools and the environment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.types import StepResult
from ..tools import Tool, ToolConversation, ToolResult

__all__ = [
    "BRANCHES",
    "VERBS",
    "PHRASES",
    "MAIN_BRANCH",
    "BranchTask",
    "BranchRepo",
    "BranchEnv",
    "branch_tools",
    "expected_state",
]


BRANCHES = ("alpha", "docs", "hotfix", "release")
VERBS = ("switch", "delete", "create")
PHRASES: Mapping[str, tuple[str, ...]] = {
    "switch": ("Switch to branch {}.", "Check out {}."),
    "delete": ("Delete branch {}.", "Remove the {} branch."),
    "create": ("Create a branch named {}.", "Start a new branch {}."),
}
MAIN_BRANCH = "main"
_NAME = {
    "type": "object",
    "properties": {"name": {"type": "string", "description": "the branch name"}},
    "required": ["name"],
    "additionalProperties": False,
}


@dataclass(frozen=True, slots=True)
class BranchTask:
    """One request: ``verb`` applied to ``name`` on a repository with ``branches`` (current: main)."""

    task_id: str
    verb: str
    name: str
    request: str
    branches: tuple[str, ...]


@dataclass(slots=True)
class BranchRepo:
    """The repository an episode's tools act on."""

    branches: set[str]
    current: str = MAIN_BRANCH


def expected_state(task: BranchTask) -> tuple[frozenset[str], str]:
    """The repository after the requested change: (branches, current)."""
    branches = set(task.branches)
    if task.verb == "switch":
        return frozenset(branches), task.name
    if task.verb == "delete":
        branches.discard(task.name)
    else:
        branches.add(task.name)
    return frozenset(branches), MAIN_BRANCH


def branch_tools() -> list[Tool]:
    """The three tools; each handler acts on the episode's :class:`BranchRepo`."""

    def switch(repo: BranchRepo, args: Mapping[str, Any]) -> ToolResult:
        name = args["name"]
        if name not in repo.branches:
            return ToolResult(f"error: no branch named '{name}'")
        if name == repo.current:
            return ToolResult(f"error: already on '{name}'")
        repo.current = name
        return ToolResult(f"Switched to branch '{name}'", done=True)

    def delete(repo: BranchRepo, args: Mapping[str, Any]) -> ToolResult:
        name = args["name"]
        if name not in repo.branches:
            return ToolResult(f"error: no branch named '{name}'")
        if name == repo.current:
            return ToolResult(f"error: cannot delete the current branch '{name}'")
        repo.branches.discard(name)
        return ToolResult(f"Deleted branch '{name}'", done=True)

    def create(repo: BranchRepo, args: Mapping[str, Any]) -> ToolResult:
        name = args["name"]
        if name in repo.branches:
            return ToolResult(f"error: a branch named '{name}' already exists")
        repo.branches.add(name)
        return ToolResult(f"Created branch '{name}'", done=True)

    return [
        Tool("switch_branch", "Switch to an existing branch.", _NAME, switch),
        Tool("delete_branch", "Delete a branch.", _NAME, delete),
        Tool("create_branch", "Create a new branch.", _NAME, create),
    ]


class BranchEnv:
    """One episode: the repository, and the tool conversation that acts on it."""

    def __init__(self, task: BranchTask, conversation: ToolConversation) -> None:
        self.task = task
        self.conversation = conversation
        self.repo = BranchRepo(set(task.branches))

    def reset(self) -> tuple[int, ...]:
        self.repo = BranchRepo(set(self.task.branches))
        return self.conversation.start([{"role": "user", "content": self.task.request}])

    def step(self, action: Sequence[int]) -> StepResult:
        turn = self.conversation.respond(action, self.repo)
        return StepResult(turn.observation, turn.done, turn.calls, turn.invalid)

    def verdict(self) -> float:
        return float((frozenset(self.repo.branches), self.repo.current) == expected_state(self.task))

    def close(self) -> None:
        pass
