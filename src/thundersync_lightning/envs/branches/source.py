"""Branch requests: a task solved only by calling the right tool with the right argument.

A user asks for one change to a repository's branches, in words ("Remove the docs branch.").
The model acts through native tool calls rendered by its chat template (:mod:`..tools`):

    switch_branch {"name": N}   make N the current branch     (N must exist and not be current)
    delete_branch {"name": N}   delete N                       (N must exist and not be current)
    create_branch {"name": N}   create N                       (N must not exist)

A call that changes the repository ends the episode; a call that cannot apply (an absent branch,
an existing one, the current one) answers an error message and the model may try again, up to
``max_turns``. A malformed call (not JSON, unknown tool, arguments failing the schema) is an error
message too and counts in ``rollout/invalid_tool_call_fraction``. The verdict compares the final
repository with the requested one: reward 1 when the requested change, and only it, was made.
No text answer can earn a reward: only a correct call changes the state the verdict reads.

Held-out split by request: the (verb, branch) pair with index ``(v + b) % holdout_every == 0`` is
held out, so every verb and every branch name is seen in training, but a held-out pair never is
(the model must compose the verb's tool with the named branch). Task variants differ in wording
and in which other branches exist.

The repository is host-side state of the episode (no sandbox): the tools stand for an API whose
effect a grader checks, as in function-calling benchmarks graded by final state.
"""

from __future__ import annotations

import random
from typing import Any

from ...core.errors import ConfigError
from ..chat import ChatRenderer
from ..selection import pick
from ..tools import ToolConversation, TurnBudget
from .env import (
    BRANCHES,
    MAIN_BRANCH,
    PHRASES,
    VERBS,
    BranchEnv,
    BranchTask,
    branch_tools,
)

__all__ = ["BranchTasks", "all_branch_tasks", "is_held_out", "OBSERVATION_TOKENS"]

OBSERVATION_TOKENS = 128  # a turn's observation, at most (its TurnBudget's max_tokens)


def is_held_out(task: BranchTask, holdout_every: int = 4) -> bool:
    """The split rule: the pair (verb v, branch b) is held out when ``(v + b) % holdout_every == 0``."""
    return (VERBS.index(task.verb) + BRANCHES.index(task.name)) % holdout_every == 0


def all_branch_tasks(variants: int = 8, seed: int = 0) -> list[BranchTask]:
    """``variants`` tasks per (verb, branch) pair: wordings in turn, other branches drawn per task."""
    out = []
    for verb in VERBS:
        for name in BRANCHES:
            for i in range(variants):
                rng = random.Random(f"{seed}-{verb}-{name}-{i}")
                others = [b for b in BRANCHES if b != name]
                present = {b for b in others if rng.random() < 0.5} | {MAIN_BRANCH}
                if verb != "create":
                    present.add(name)
                phrase = PHRASES[verb][i % len(PHRASES[verb])]
                out.append(
                    BranchTask(f"{verb}-{name}-{i}", verb, name, phrase.format(name), tuple(sorted(present)))
                )
    return out


class BranchTasks:
    """The task source of branch requests, with a held-out split by (verb, branch) pair.

    Args:
        tokenizer_path: a local tokenizer whose chat template renders tools (e.g. the directory
            :mod:`.start` writes: tokenizer, template and a starting policy).
        max_turns: calls per episode (an error lets the model try again).
        max_action_tokens: tokens per turn (a call and the end of turn take 10 with
            the tokenizer of :mod:`.start`).
        variants: tasks per (verb, branch) pair.
        holdout_every: the pair (v, b) is held out when ``(v + b) % holdout_every == 0``.
        chat_template / template_kwargs / tool_parser: as in :class:`~..chat.ChatRenderer` and
            :func:`~..tools.get_tool_parser`.
        seed: draws the other branches of each variant.
    """

    def __init__(
        self,
        tokenizer_path: str,
        max_turns: int = 3,
        max_action_tokens: int = 32,
        variants: int = 8,
        holdout_every: int = 4,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        tool_parser: str = "hermes",
        seed: int = 0,
    ) -> None:
        problems = []
        if max_turns < 1:
            problems.append(f"max_turns={max_turns}: must be >= 1")
        if max_action_tokens < 1:
            problems.append(f"max_action_tokens={max_action_tokens}: must be >= 1")
        if variants < 1:
            problems.append(f"variants={variants}: must be >= 1")
        if holdout_every < 2:
            problems.append(f"holdout_every={holdout_every}: must be >= 2 (1 would hold out every pair)")
        if problems:
            raise ConfigError("BranchTasks: " + "; ".join(problems))
        self.max_turns, self.max_action_tokens = max_turns, max_action_tokens
        self.holdout_every, self.tool_parser = holdout_every, tool_parser
        self.renderer = ChatRenderer(tokenizer_path, chat_template, template_kwargs)
        self.all_tasks = all_branch_tasks(variants, seed)

    @property
    def stop_token(self) -> int:
        return self.renderer.end_of_turn

    @property
    def train_tasks(self) -> list[BranchTask]:
        return [t for t in self.all_tasks if not is_held_out(t, self.holdout_every)]

    def validation_tasks(self) -> list[BranchTask]:
        """The held-out tasks, in a fixed order."""
        return [t for t in self.all_tasks if is_held_out(t, self.holdout_every)]

    def tasks(self, step: int, num_groups: int, seed: int) -> list[BranchTask]:
        """``num_groups`` training tasks: a seeded permutation per step, cycled if more are asked."""
        return pick(self.train_tasks, step, num_groups, seed)

    def make_env(self, task: Any, seed: int) -> BranchEnv:
        if not isinstance(task, BranchTask):
            raise ConfigError(f"BranchTasks.make_env: expected a BranchTask, got {type(task).__name__}")
        del seed  # deterministic environment
        return BranchEnv(
            task,
            ToolConversation(
                self.renderer,
                branch_tools(),
                self.tool_parser,
                max_result_chars=256,
                budget=TurnBudget(max_calls=2, max_chars=512, max_tokens=OBSERVATION_TOKENS),
            ),
        )

    def max_episode_tokens(self) -> int:
        """A bound on one episode, whatever the policy writes: the longest prompt, and per turn an
        action and an observation (at most :data:`OBSERVATION_TOKENS`, the turn budget's)."""
        schemas = [t.schema() for t in branch_tools()]
        prompt = max(
            len(self.renderer.prompt_ids([{"role": "user", "content": r}], schemas))
            for r in {t.request for t in self.all_tasks}
        )
        return prompt + self.max_turns * (self.max_action_tokens + OBSERVATION_TOKENS)
