"""``DatasetTasks``: your prompts (a ``datasets`` file), your rewards and your tools, from YAML.

Data: a JSONL/JSON file, a parquet file, a directory written by ``Dataset.save_to_disk``, or in
memory a ``datasets.Dataset`` or a list of dicts (:mod:`.rows`: a bad line is named by file and
line). ``prompt`` is a string or a list of messages (TRL's conversational format, kept as it is,
system prompts included). ``fields`` maps the names this source uses to your columns: ``prompt`` (required) and whatever the
reward reads (``answer``, ``tests``, ``pattern``, ...); every mapped field reaches the reward as a
keyword argument. Missing columns are a ConfigError at construction (all of them listed); a row
whose mapped value is null fails its trajectories (reward 0, the reason in ``RewardReady.failure``).

Rewards: one or several (``reward: [a, b]``, ``reward_weights: [1.0, 0.5]``: ``R = sum_i w_i r_i``,
each ``r_i`` logged as ``rollout/reward/{name}_mean``; :mod:`.reward_sum`).

Tools: ``tools: [my_tools:calculator, ...]`` (:mod:`..tools.python_tools`: schemas from type hints
and docstrings, or given and checked at set-up; each call in a worker process killed past
``tool_timeout_s``) makes each episode a tool-calling one (:mod:`.tool_env`); it needs the model's
tokenizer and chat template (``tokenizer_path``).

Turns: with ``max_turns=1`` the completion is graded once. With ``max_turns > 1`` the environment
grades every answer; a reward >= ``success_reward`` ends the episode, otherwise ``feedback`` is
sent back as a user message and the policy answers again; the verdict is the last answer's reward.

Text: with ``tokenizer_path`` (a local Hugging Face tokenizer directory, normally the model's own,
the same as ``GRPOPolicy(pretrained_path=...)``) the conversation is rendered with its chat template
by :class:`~thundersync_lightning.envs.chat.ChatRenderer` (``chat_template=`` overrides it; a
tokenizer without one is a ConfigError unless ``use_chat_template=False``), and a turn ends with
the tokenizer's EOS. Without a tokenizer the text is byte-level (ids 0-255, end of turn 256): the
policy needs ``vocab_size >= 259`` (:attr:`DatasetTasks.vocab_size`; a smaller one is a ConfigError
when the data module sets up).

Bound: :meth:`DatasetTasks.max_episode_tokens` holds whatever the policy writes: a tool turn's
observation is cut to its :class:`~..tools.TurnBudget`'s ``max_tokens``, a feedback turn's to
the feedback message's tokens.

Split: rows whose index hashes below ``val_fraction`` are held out (:meth:`validation_tasks`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ...core.errors import ConfigError
from ...core.protocols import STEP_TIMEOUT_S
from ..chat import ChatRenderer
from ..codec import ByteCodec
from ..selection import held_out, pick
from ..tokens import load_tokenizer
from ..tools.conversation import TurnBudget, turn_token_cap
from ..tools.python_tools import python_tools
from .env import DatasetEnv, DatasetTask
from .reward_sum import RewardSum
from .rows import read_rows
from .tool_env import DatasetToolEnv

__all__ = ['DatasetTasks', 'load_rows']

log = logging.getLogger(__name__)


def load_rows(path: str, split: str = "train") -> Any:
    """A ``datasets.Dataset`` from a JSONL/JSON/parquet file or a ``save_to_disk`` directory."""
    import datasets

    if not os.path.exists(path):
        raise ConfigError(f"DatasetTasks: {path!r} does not exist")
    if os.path.isdir(path):
        data = datasets.load_from_disk(path)
        if isinstance(data, datasets.DatasetDict):
            if split not in data:
                raise ConfigError(f"DatasetTasks: {path!r} has splits {list(data)}, not {split!r}")
            data = data[split]
        return data
    kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(os.path.splitext(path)[1])
    if kind is None:
        raise ConfigError(f"DatasetTasks: {path!r}: use .jsonl, .json, .parquet or a save_to_disk directory")
    return datasets.load_dataset(kind, data_files=path, split="train")


class DatasetTasks:
    """Args:
    path: the data (see the module docstring): a file, a directory, a ``datasets.Dataset`` or a list
        of dicts. split: the split of a DatasetDict.
    fields: canonical name -> column (default: each name maps to itself); ``prompt`` is required.
    reward: a registered name, ``{name: ..., **kwargs}``, ``{function: "module:callable"}`` (see
        :mod:`.rewards`), or a list of them. reward_weights: one weight per reward (default 1 each).
    tools: ``module:function`` names or ``{function, name, description, parameters}`` mappings.
        tool_timeout_s: the deadline of one call. tool_parser: the call format (``hermes``).
        max_tool_result_chars: each result is clipped to this. end_on_answer: a turn without a
        call ends the episode (else a reminder naming the tools). template_kwargs: chat template
        options (``{enable_thinking: false}``).
    max_turns, max_action_tokens: episode bounds. feedback / success_reward: multi-turn retries.
    system_prompt: an optional system message. tokenizer_path / chat_template / use_chat_template:
        rendering (module docstring). val_fraction: held-out share (by row index).
    """

    def __init__(
        self,
        path: Any,
        fields: dict[str, str] | None = None,
        reward: Any = "exact_match",
        split: str = "train",
        max_turns: int = 1,
        max_action_tokens: int = 64,
        feedback: str = "Incorrect. Try again.",
        success_reward: float = 1.0,
        system_prompt: str | None = None,
        tokenizer_path: str | None = None,
        chat_template: str | None = None,
        use_chat_template: bool = True,
        val_fraction: float = 0.1,
        reward_weights: list[float] | None = None,
        tools: list[str | dict[str, Any]] | None = None,
        tool_timeout_s: float = 10.0,
        tool_parser: str = "hermes",
        max_tool_result_chars: int = 4096,
        end_on_answer: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        problems = []
        if max_turns < 1 or max_action_tokens < 1:
            problems.append(f"max_turns={max_turns} and max_action_tokens={max_action_tokens} must be >= 1")
        if not 0.0 <= val_fraction < 1.0:
            problems.append(f"val_fraction={val_fraction} must be in [0, 1)")
        if not tool_timeout_s > 0:
            problems.append(f"tool_timeout_s={tool_timeout_s} must be > 0 seconds")
        mapping = {"prompt": "prompt", **(fields or {})}
        reward_sum: RewardSum | None = None
        try:
            reward_sum = RewardSum(reward, reward_weights)
        except ConfigError as exc:
            problems.append(str(exc))
        data = read_rows(path, split)
        missing = [f"{name} -> column {col!r}" for name, col in mapping.items() if col not in data.columns]
        if missing:
            problems.append(f"{data.origin!r} lacks mapped columns: {', '.join(missing)} (columns: {list(data.columns)})")
        if reward_sum is not None and not missing:
            problems.extend(reward_sum.signature_problems(list(mapping)))
        self.tools = []
        if tools:
            if not tokenizer_path or not use_chat_template:
                problems.append("tools need the model's chat template: set tokenizer_path (the model's directory)")
            try:
                self.tools = python_tools(tools, tool_timeout_s)
            except ConfigError as exc:
                problems.append(str(exc))
        if problems:
            raise ConfigError("DatasetTasks: " + "\n".join(problems))
        assert reward_sum is not None
        self.reward_sum = reward_sum
        self.tool_timeout_s, self.tool_parser = tool_timeout_s, tool_parser
        self.max_tool_result_chars, self.end_on_answer = max_tool_result_chars, end_on_answer
        self.path = data.origin
        self.fields, self.reward_spec = mapping, reward
        self.max_turns, self.max_action_tokens = max_turns, max_action_tokens
        self.feedback, self.success_reward, self.system_prompt = feedback, success_reward, system_prompt
        self.val_fraction = val_fraction
        self.rows = [DatasetTask(i, {name: r.get(col) for name, col in mapping.items()})
                     for i, r in enumerate(data.rows)]
        self.renderer = (ChatRenderer(tokenizer_path, chat_template, template_kwargs)
                         if tokenizer_path and use_chat_template else None)
        self.tokenizer_path = tokenizer_path
        self.codec = ByteCodec() if tokenizer_path is None else None
        self.turn_budget: TurnBudget | None = None
        if self.tools and self.renderer is not None:
            chars, calls = TurnBudget().max_chars, TurnBudget().max_calls
            cap = turn_token_cap(self.renderer, [t.schema() for t in self.tools], chars, calls)
            self.turn_budget = TurnBudget(max_calls=calls, max_chars=chars, max_tokens=cap)
            turn_s = (self.turn_budget.deadline_s or 0.0) + tool_timeout_s  # a call may start at the deadline
            if turn_s > STEP_TIMEOUT_S:
                log.warning("DatasetTasks: a tool turn may take %g s (its %g s deadline + tool_timeout_s %g), past "
                            "the engines' default step_timeout_s of %g s: raise the engine's step_timeout_s above "
                            "it, or such turns fail their trajectory", turn_s, self.turn_budget.deadline_s,
                            tool_timeout_s, STEP_TIMEOUT_S)
        self._episode_bound: int | None = None
        self._feedback_tokens: int | None = None

    # ------------------------------------------------------------------ tokens
    @property
    def vocab_size(self) -> int:
        """Token ids the text uses: the tokenizer's (added tokens included), else the byte codec's 259."""
        if self.renderer is not None:
            return len(self.renderer.tokenizer)
        if self.codec is not None:
            return self.codec.vocab_size
        return len(self._plain_tokenizer())

    @property
    def stop_token(self) -> int:
        if self.renderer is not None:
            return self.renderer.end_of_turn
        if self.codec is not None:
            return self.codec.end_of_action
        return int(self._plain_tokenizer().eos_token_id)

    def _plain_tokenizer(self) -> Any:
        return load_tokenizer(str(self.tokenizer_path))

    # ------------------------------------------------------------------ tasks and split
    def _held_out(self, task: DatasetTask) -> bool:
        return held_out(str(task.index), self.val_fraction)

    def validation_tasks(self) -> list[DatasetTask]:
        return [t for t in self.rows if self._held_out(t)]

    def tasks(self, step: int, num_groups: int, seed: int) -> list[DatasetTask]:
        return pick([t for t in self.rows if not self._held_out(t)] or self.rows, step, num_groups, seed)

    @property
    def reward_names(self) -> tuple[str, ...]:
        """The names each reward is logged under (``rollout/reward/{name}_mean``)."""
        return self.reward_sum.names

    def messages_of(self, task: DatasetTask) -> list[dict[str, Any]]:
        """The row's prompt as messages: a string becomes one user message; a list of messages is
        kept. ``system_prompt`` goes first unless the row has its own system message."""
        prompt = task.row["prompt"]
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}]
        else:
            ok = isinstance(prompt, list) and prompt and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in prompt)
            if not ok:
                raise ValueError(f"row {task.index} of {self.path!r}: prompt must be a string or a list of "
                                 f"{{'role': ..., 'content': <string>}} messages, got {str(prompt)[:120]}")
            messages = [dict(m) for m in prompt]
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def feedback_tokens(self) -> int:
        """A feedback turn's observation, at most: the end of turn (when the engine cut the turn)
        and the feedback message as :meth:`DatasetEnv.step` renders it (it cuts there)."""
        if self._feedback_tokens is None:
            if self.renderer is not None:
                history = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
                self._feedback_tokens = 1 + len(self.renderer.observation_ids(history, self.feedback))
            else:
                encode = (self.codec.encode if self.codec is not None
                          else lambda t: self._plain_tokenizer().encode(t, add_special_tokens=False))
                self._feedback_tokens = max(len(encode("\n" + self.feedback + "\n")), len(encode(self.feedback + "\n")))
        return self._feedback_tokens

    def max_episode_tokens(self) -> int:
        """A bound on one episode's tokens whatever the policy writes (the memory planner's): the
        longest prompt of :attr:`rows` as ``reset`` renders it, ``max_turns`` actions of at most
        ``max_action_tokens`` (end of turn included), and an observation after each turn (tools: at
        most the turn budget's ``max_tokens``, the last turn's included) or after each turn but the
        last (feedback: :meth:`feedback_tokens`). Renders every row once, then cached."""
        if self._episode_bound is None:
            prompt = 0
            for task in self.rows:
                try:
                    prompt = max(prompt, len(self.make_env(task, 0).reset()))
                except ValueError:  # a null field or a malformed prompt: the episode fails before acting
                    continue
            if self.turn_budget is not None:
                assert self.turn_budget.max_tokens is not None
                observations = self.max_turns * self.turn_budget.max_tokens
            else:
                observations = (self.max_turns - 1) * self.feedback_tokens()
            self._episode_bound = prompt + self.max_turns * self.max_action_tokens + observations
        return self._episode_bound

    def make_env(self, task: DatasetTask, seed: int) -> DatasetEnv | DatasetToolEnv:
        del seed
        nulls = [name for name, value in task.row.items() if value is None]
        if nulls:
            raise ValueError(f"row {task.index} of {self.path!r} has no value for mapped field(s) {nulls}")
        if self.tools:
            return DatasetToolEnv(self, task)
        return DatasetEnv(self, task)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)


