"""``MutationTasks``: the TaskSource of generated bug-fix tasks, with a held-out split by task id.

Split: a task is held out when ``blake2b(task_id) mod 10_000 < val_fraction * 10_000``, so the
split depends on the id alone (not on the list's order or length) and never changes between
processes or runs. Training steps draw only training tasks (:meth:`tasks`); validation uses
:meth:`validation_tasks`, the held-out tasks in id order (the ``validation_tasks`` member of a
task source; see :class:`~thundersync_lightning.modules.RolloutDataModule`).
"""

from __future__ import annotations

from typing import Any

from ...core.errors import ConfigError
from ...core.types import ModelSpec
from ..repo.episode import ActionFormat
from ..repo.tools import code_episode_tokens, tool_conversation, tool_renderer
from ..sandbox.base import SandboxLimits
from ..sandbox.bwrap import BwrapConfig
from ..sandbox.uids import uid_pool
from ..selection import held_out, pick
from ..tiny_model import toy_model_spec
from .env import ActionVocab, MutationEnv, tools_prompt
from .generate import MutationTask, generate_tasks

__all__ = ["MutationTasks", "is_held_out", "OBSERVATION_BYTES"]

OBSERVATION_BYTES = 2048  # tools format: a turn's results together, at most (characters)


def is_held_out(task_id: str, val_fraction: float) -> bool:
    """The split rule: a hash of the id alone decides."""
    return held_out(task_id, val_fraction)


class MutationTasks:
    """Generated bug-fix tasks in bubblewrap (see :mod:`.env` for the action language).

    Args:
        num_candidates: K, candidate edits per task (one is the fix).
        num_visible: visible tests per task (the first inputs of the seed function).
        max_turns: actions per episode; ``2K - 1`` suffices to try every edit (``K + 1`` with
            ``test_on_edit``).
        test_on_edit: an edit also runs the visible tests and answers PASS / FAIL (see :mod:`.env`).
        val_fraction: share of tasks held out for validation (by task id).
        timeout_s / memory_bytes / nproc: limits of one sandboxed test run.
        disk_bytes / disk_inodes: the workspace's disk and inode budget (a tmpfs of its own: RAM).
        sandbox_root: host folder for the workspaces; uid_base / uid_count: the sandbox uids.
        python: interpreter inside the sandbox (Debian's ``python3``).
        action_format: ``text`` (the one-token action language of :mod:`.env`) or ``tools``
            (native tool calls through ``tokenizer_path``'s chat template: ``bash``,
            ``str_replace_editor``, ``submit``). ``tools`` only: ``max_action_tokens`` per turn,
            ``chat_template`` / ``template_kwargs`` / ``tool_parser`` as in ``LocalCodeTasks``.
    """

    def __init__(
        self,
        num_candidates: int = 4,
        num_visible: int = 3,
        max_turns: int = 8,
        val_fraction: float = 0.2,
        timeout_s: float = 10.0,
        memory_bytes: int = 512 * 1024**2,
        nproc: int = 64,
        disk_bytes: int = 64 * 1024**2,
        disk_inodes: int = 10_000,
        sandbox_root: str = "/tmp/thundersync-mutations",
        uid_base: int = 3_300_000,
        uid_count: int = 1024,
        python: str = "python3",
        test_on_edit: bool = False,
        action_format: ActionFormat = "text",
        tokenizer_path: str | None = None,
        max_action_tokens: int = 512,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        tool_parser: str = "hermes",
    ) -> None:
        problems = []
        if num_candidates < 2:
            problems.append(f"num_candidates={num_candidates}: need >= 2 (the fix and a decoy)")
        if not 1 <= num_visible <= 6:
            problems.append(f"num_visible={num_visible}: must be in 1..6 (every seed function has 6 inputs)")
        if max_turns < 1:
            problems.append(f"max_turns={max_turns}: must be >= 1")
        if not 0.0 < val_fraction < 1.0:
            problems.append(f"val_fraction={val_fraction}: must be in (0, 1)")
        if problems:
            raise ConfigError("MutationTasks: " + "; ".join(problems))
        self.num_candidates, self.num_visible, self.max_turns = num_candidates, num_visible, max_turns
        self.val_fraction = val_fraction
        self.sandbox_root, self.uid_base, self.uid_count, self.python = (
            sandbox_root,
            uid_base,
            uid_count,
            python,
        )
        self.bwrap = BwrapConfig(
            limits=SandboxLimits(
                timeout_s=timeout_s,
                memory_bytes=memory_bytes,
                nproc=nproc,
                max_output_bytes=16 * 1024,
                disk_bytes=disk_bytes,
                disk_inodes=disk_inodes,
            )
        )
        self.vocab = ActionVocab(num_candidates)
        self.test_on_edit = test_on_edit
        self.action_format, self.tool_parser = action_format, tool_parser
        self.renderer = tool_renderer(
            "MutationTasks", action_format, tokenizer_path, chat_template, template_kwargs, tool_parser
        )
        self.max_action_tokens = 1 if self.renderer is None else max_action_tokens

    @property
    def stop_token(self) -> int | None:
        """None for one-token actions; the chat template's end of turn with tools."""
        return None if self.renderer is None else self.renderer.end_of_turn

    # ------------------------------------------------------------------ the split
    @property
    def all_tasks(self) -> list[MutationTask]:
        return generate_tasks(self.num_candidates, self.num_visible)

    @property
    def train_tasks(self) -> list[MutationTask]:
        return [t for t in self.all_tasks if not is_held_out(t.task_id, self.val_fraction)]

    def validation_tasks(self) -> list[MutationTask]:
        """The held-out tasks, in task-id order."""
        return [t for t in self.all_tasks if is_held_out(t.task_id, self.val_fraction)]

    def tasks(self, step: int, num_groups: int, seed: int) -> list[MutationTask]:
        """``num_groups`` training tasks: a seeded permutation per step, cycled if more are asked."""
        return pick(self.train_tasks, step, num_groups, seed)

    # ------------------------------------------------------------------ environments
    @property
    def vocab_size(self) -> int:
        return self.vocab.size

    def model_spec(self) -> ModelSpec:
        """The tiny Qwen3 of the toy task, vocabulary rounded up to a multiple of 8."""
        return toy_model_spec(vocab_size=8 * -(-self.vocab.size // 8))

    def make_env(self, task: Any, seed: int) -> MutationEnv:
        if not isinstance(task, MutationTask):
            raise ConfigError(f"MutationTasks.make_env: expected a MutationTask, got {type(task).__name__}")
        del seed  # deterministic environment
        conversation = (
            None
            if self.renderer is None
            else tool_conversation(self.renderer, self.tool_parser, self.python, OBSERVATION_BYTES)
        )
        return MutationEnv(
            task,
            self.vocab,
            uid_pool(self.uid_base, self.uid_count),
            self.sandbox_root,
            self.bwrap,
            self.python,
            self.test_on_edit,
            conversation,
        )

    def max_episode_tokens(self) -> int:
        """A bound on one episode's tokens whatever the policy writes (the memory planner's). Text
        format: ``[START]``, then per turn one action token and at most one answer token. Tools
        format: :func:`~..repo.tools.code_episode_tokens` over the tasks' prompts, with
        :data:`OBSERVATION_BYTES` per turn."""
        if self.renderer is None:
            return 1 + 2 * self.max_turns
        return code_episode_tokens(
            (tools_prompt(t) for t in self.all_tasks),
            max_turns=self.max_turns,
            max_action_tokens=self.max_action_tokens,
            max_observation_bytes=OBSERVATION_BYTES,
            codec=None,
            renderer=self.renderer,
        )
