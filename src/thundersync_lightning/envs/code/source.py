"""``LocalCodeTasks``: the TaskSource of local repository tasks (shipped or a directory of your own).

YAML-constructible (typed scalar arguments only) and picklable: the uid pool and loaded tasks are
rebuilt lazily in whichever process uses them (the engine subprocess). ``SplitLocalCodeTasks`` holds
some tasks out for validation (``RolloutDataModule(val_samples=...)``): the names in ``val_names``, or
else the tasks whose name hashes below ``val_fraction``; training steps draw only the others.
"""

from __future__ import annotations

from typing import Any

from ...core.errors import ConfigError
from ...core.options import strict_options
from ..codec import ByteCodec, HFTokenizerCodec, TextCodec
from ..repo.episode import ActionFormat, CodeEnv, render_prompt
from ..repo.tools import code_episode_tokens, tool_conversation, tool_renderer
from ..sandbox.base import SandboxLimits
from ..sandbox.bwrap import BwrapConfig
from ..sandbox.uids import uid_pool
from ..selection import held_out, pick
from .task import LocalTask, load_tasks
from .workspace import COMMAND_TIMEOUT_S, TEST_TIMEOUT_S, LocalWorkspace, WorkspaceSettings

__all__ = ["LocalCodeTasks", "SplitLocalCodeTasks", "uid_pool"]


@strict_options
class LocalCodeTasks:
    """Local repository tasks; text is byte-level (stop token ``ByteCodec.END_OF_ACTION``) unless
    ``tokenizer_path`` names a local Hugging Face tokenizer (stop token: its EOS id).

    Args:
        task_dir: a folder of task directories (each with task.yaml); None = the shipped tasks.
        names: only these tasks (by name), in this order.
        max_turns / max_action_tokens: episode bounds the engine enforces.
        max_observation_bytes: how much command output the agent sees per turn.
        command_timeout_s / test_timeout_s: limits of one agent command / of the grading test run.
        parallel_tests: grading runs at once in this process (0: twice the CPU count).
        memory_bytes / nproc / cpus: memory (all processes together, tmpfs included; also each
            process's address space), process count and CPU share of one sandboxed command.
        disk_bytes / disk_inodes: the workspace's disk and inode budget (a tmpfs of its own).
        sandbox_root: host folder for the workspaces. uid_base / uid_count: the sandbox uids.
        python: interpreter with pytest inside the sandbox. ro_binds: extra read-only host paths.
        tokenizer_path: a local HF tokenizer directory instead of the byte-level codec.
        action_format: ``text`` (the action language of ``envs/repo/actions.py``) or ``tools``
            (native tool calls through the tokenizer's chat template: ``bash``,
            ``str_replace_editor``, ``submit``; needs ``tokenizer_path``).
        chat_template / template_kwargs / tool_parser: ``tools`` format only: a Jinja template
            replacing the tokenizer's, template variables (``{enable_thinking: false}``), the
            tool-call parser's name (``hermes``).
    """

    def __init__(
        self,
        task_dir: str | None = None,
        names: list[str] | None = None,
        max_turns: int = 6,
        max_action_tokens: int = 512,
        max_observation_bytes: int = 1024,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        test_timeout_s: float = TEST_TIMEOUT_S,
        parallel_tests: int = 0,
        memory_bytes: int = 2 * 1024**3,
        nproc: int = 256,
        cpus: float = 1.0,
        disk_bytes: int = 1024**3,
        disk_inodes: int = 100_000,
        sandbox_root: str = "/tmp/thundersync-sandboxes",
        uid_base: int = 3_100_000,
        uid_count: int = 512,
        python: str = "python3",
        ro_binds: list[str] | None = None,
        tokenizer_path: str | None = None,
        action_format: ActionFormat = "text",
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        tool_parser: str = "hermes",
    ) -> None:
        problems = [
            f"{k} must be >= 1"
            for k, v in (
                ("max_turns", max_turns),
                ("max_action_tokens", max_action_tokens),
                ("uid_count", uid_count),
            )
            if v < 1
        ]
        if problems:
            raise ConfigError("LocalCodeTasks: " + "; ".join(problems))
        self.task_dir, self.names = task_dir, list(names) if names is not None else None
        self.max_turns, self.max_action_tokens = max_turns, max_action_tokens
        self.max_observation_bytes = max_observation_bytes
        self.uid_base, self.uid_count = uid_base, uid_count
        limits = SandboxLimits(
            timeout_s=command_timeout_s,
            memory_bytes=memory_bytes,
            nproc=nproc,
            cpus=cpus,
            disk_bytes=disk_bytes,
            disk_inodes=disk_inodes,
        )
        self.settings = WorkspaceSettings(
            bwrap=BwrapConfig(limits=limits, ro_binds=tuple(ro_binds or ())),
            root=sandbox_root,
            python=python,
            test_timeout_s=test_timeout_s,
            parallel_tests=parallel_tests,
        )
        self._tasks: list[LocalTask] | None = None
        self.codec: TextCodec = HFTokenizerCodec(tokenizer_path) if tokenizer_path else ByteCodec()
        self.action_format, self.tool_parser = action_format, tool_parser
        self.renderer = tool_renderer(
            "LocalCodeTasks", action_format, tokenizer_path, chat_template, template_kwargs, tool_parser
        )

    @property
    def stop_token(self) -> int | None:
        """The end of an action: the chat template's end of turn (tools) or the codec's end-of-action id."""
        return self.renderer.end_of_turn if self.renderer is not None else self.codec.end_of_action

    @property
    def all_tasks(self) -> list[LocalTask]:
        if self._tasks is None:
            self._tasks = load_tasks(self.task_dir, self.names)
        return self._tasks

    def tasks(self, step: int, num_groups: int, seed: int) -> list[LocalTask]:
        return pick(self.all_tasks, step, num_groups, seed)

    def make_env(self, task: Any, seed: int) -> CodeEnv:
        if not isinstance(task, LocalTask):
            raise ConfigError(f"LocalCodeTasks.make_env: expected a LocalTask, got {type(task).__name__}")
        del seed  # the environment is deterministic
        workspace = LocalWorkspace(task, self.settings, uid_pool(self.uid_base, self.uid_count))
        conversation = (
            None
            if self.renderer is None
            else tool_conversation(
                self.renderer, self.tool_parser, self.settings.python, self.max_observation_bytes
            )
        )
        return CodeEnv(
            workspace,
            self._prompt(task),
            self.codec,
            self.max_observation_bytes,
            self.settings.python,
            conversation,
        )

    def _prompt(self, task: LocalTask) -> str:
        return render_prompt(task.problem_statement, [path for path, _ in task.files], self.action_format)

    def max_episode_tokens(self) -> int:
        """A bound on one episode's tokens whatever the policy writes (the memory planner's): the
        longest prompt of :attr:`all_tasks`, then per turn ``max_action_tokens`` and the observation
        cap (:func:`~..repo.tools.code_episode_tokens`)."""
        return code_episode_tokens(
            (self._prompt(t) for t in self.all_tasks),
            max_turns=self.max_turns,
            max_action_tokens=self.max_action_tokens,
            max_observation_bytes=self.max_observation_bytes,
            codec=self.codec,
            renderer=self.renderer,
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tasks"] = None
        return state


class SplitLocalCodeTasks(LocalCodeTasks):
    """``LocalCodeTasks`` arguments, plus ``val_names`` (explicit held-out tasks) or ``val_fraction``."""

    def __init__(
        self, *args: Any, val_names: list[str] | None = None, val_fraction: float = 0.25, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if not 0.0 < val_fraction < 1.0:
            raise ConfigError(f"SplitLocalCodeTasks: val_fraction={val_fraction} must be in (0, 1)")
        self.val_names = list(val_names) if val_names is not None else None
        self.val_fraction = val_fraction

    def _held_out(self, task: LocalTask) -> bool:
        if self.val_names is not None:
            return task.name in self.val_names
        return held_out(task.name, self.val_fraction)

    def validation_tasks(self) -> list[LocalTask]:
        held = [t for t in self.all_tasks if self._held_out(t)]
        unknown = sorted(set(self.val_names or ()) - {t.name for t in self.all_tasks})
        if unknown or not held or len(held) == len(self.all_tasks):
            raise ConfigError(
                f"SplitLocalCodeTasks: the split leaves {len(held)} of {len(self.all_tasks)} tasks "
                f"held out (unknown val_names: {unknown}); both sides need at least one task"
            )
        return held

    def tasks(self, step: int, num_groups: int, seed: int) -> list[LocalTask]:
        train = [t for t in self.all_tasks if not self._held_out(t)]
        return pick(train, step, num_groups, seed)
