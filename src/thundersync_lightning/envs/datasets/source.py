"""``DatasetTasks``: your prompts (a ``datasets`` file) and your reward, single- or multi-turn.

Data: a JSONL/JSON file, a parquet file, or a directory written by ``Dataset.save_to_disk``.
``fields`` maps the names this source uses to your columns: ``prompt`` (required) and whatever the
reward reads (``answer``, ``tests``, ``pattern``, ...); every mapped field reaches the reward as a
keyword argument. Missing columns are a ConfigError at construction (all of them listed); a row
whose mapped value is null fails its trajectories (reward 0, the reason in ``RewardReady.failure``).

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

Split: rows whose index hashes below ``val_fraction`` are held out (:meth:`validation_tasks`).
"""

from __future__ import annotations

import hashlib
import os
import random
from typing import Any

from ...core.errors import ConfigError
from ...core.types import derive_seed
from ..chat import ChatRenderer
from ..code.codec import ByteCodec
from .env import DatasetEnv, DatasetTask
from .rewards import check_reward_signature, resolve_reward

__all__ = ['DatasetTasks', 'load_rows']


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
    path: the data (see the module docstring). split: the split of a DatasetDict directory.
    fields: canonical name -> column (default: each name maps to itself); ``prompt`` is required.
    reward: a registered name, ``{name: ..., **kwargs}``, ``{function: "module:callable"}`` (see
        :mod:`.rewards`).
    max_turns, max_action_tokens: episode bounds. feedback / success_reward: multi-turn retries.
    system_prompt: an optional system message. tokenizer_path / chat_template / use_chat_template:
        rendering (module docstring). val_fraction: held-out share (by row index).
    """

    def __init__(
        self,
        path: str,
        fields: dict[str, str] | None = None,
        reward: str | dict[str, Any] = "exact_match",
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
    ) -> None:
        problems = []
        if max_turns < 1 or max_action_tokens < 1:
            problems.append(f"max_turns={max_turns} and max_action_tokens={max_action_tokens} must be >= 1")
        if not 0.0 <= val_fraction < 1.0:
            problems.append(f"val_fraction={val_fraction} must be in [0, 1)")
        mapping = {"prompt": "prompt", **(fields or {})}
        try:
            self.reward = resolve_reward(reward)
        except ConfigError as exc:
            problems.append(str(exc))
        data = load_rows(path, split)
        missing = [f"{name} -> column {col!r}" for name, col in mapping.items() if col not in data.column_names]
        if missing:
            problems.append(f"{path!r} lacks mapped columns: {', '.join(missing)} (columns: {data.column_names})")
        reward_fn = getattr(self, "reward", None)
        if reward_fn is not None and not missing:
            mismatch = check_reward_signature(reward_fn, list(mapping))
            if mismatch:
                problems.append(mismatch)
        if problems:
            raise ConfigError("DatasetTasks: " + "; ".join(problems))
        self.path, self.fields, self.reward_spec = path, mapping, reward
        self.max_turns, self.max_action_tokens = max_turns, max_action_tokens
        self.feedback, self.success_reward, self.system_prompt = feedback, success_reward, system_prompt
        self.val_fraction = val_fraction
        self.rows = [DatasetTask(i, {name: r.get(col) for name, col in mapping.items()}) for i, r in enumerate(data)]
        if not self.rows:
            raise ConfigError(f"DatasetTasks: {path!r} has no rows")
        self.renderer = ChatRenderer(tokenizer_path, chat_template) if tokenizer_path and use_chat_template else None
        self.tokenizer_path = tokenizer_path
        self.codec = ByteCodec() if tokenizer_path is None else None

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
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.tokenizer_path, local_files_only=True)

    # ------------------------------------------------------------------ tasks and split
    def _held_out(self, task: DatasetTask) -> bool:
        h = int.from_bytes(hashlib.blake2b(str(task.index).encode(), digest_size=8).digest(), "little") % 10_000
        return h < round(self.val_fraction * 10_000)

    def validation_tasks(self) -> list[DatasetTask]:
        return [t for t in self.rows if self._held_out(t)]

    def tasks(self, step: int, num_groups: int, seed: int) -> list[DatasetTask]:
        items = [t for t in self.rows if not self._held_out(t)] or self.rows
        rng = random.Random(derive_seed(seed, step, -1, -1))
        out: list[DatasetTask] = []
        while len(out) < num_groups:
            order = list(range(len(items)))
            rng.shuffle(order)
            out.extend(items[i] for i in order[: num_groups - len(out)])
        return out

    def make_env(self, task: DatasetTask, seed: int) -> DatasetEnv:
        del seed
        nulls = [name for name, value in task.row.items() if value is None]
        if nulls:
            raise ValueError(f"row {task.index} of {self.path!r} has no value for mapped field(s) {nulls}")
        return DatasetEnv(self, task)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)


