"""``DatasetTasks``: your prompts (a ``datasets`` file), your rewards and your tools, from YAML.

Data: a JSONL/JSON file, a parquet file, a directory written by ``Dataset.save_to_disk``, or in
memory a ``datasets.Dataset`` or a list of dicts (:mod:`.rows`: a bad line is named by file and
line). ``prompt`` is a string or a list of messages (TRL's conversational format, kept as it is,
system prompts included). Every column reaches the rewards (TRL's ``reward_kwargs``);
``fields`` only renames: ``{prompt: question, answer: solution}`` gives the column ``question`` as
``prompt`` and ``solution`` as ``answer`` (both columns stay under their own names too). A mapped
column that does not exist, or a reward parameter that names no column, is a ConfigError at
construction (all of them listed). A row whose prompt or mapped value is null, or whose prompt is
malformed, fails its trajectories at reset (:class:`~.rows.DatasetRowError`: reward 0, counted in
``rollout/reward_error_fraction`` and ``summary.json``, warned once).

Rewards: one or several (``reward: [a, b]``, ``reward_weights: [1.0, 0.5]``: ``R = sum_i w_i r_i``
over the rewards that did not return None, each ``r_i`` logged as ``rollout/reward/{name}_mean``;
:mod:`.reward_sum`), in TRL's, verl's or this project's calling convention (:mod:`.conventions`).
A completion every reward declines (None) is unscorable: warned once with its row, counted in
``rollout/unscorable_fraction``.

Tools: ``tools: [my_tools:calculator, ...]`` (in Python also the functions themselves, as TRL
takes them: ``tools=[calculator]``; :mod:`..tools.python_tools`: schemas from type hints and
docstrings, or given and checked at set-up; each call in a worker process of the episode's own,
confined by ``worker_limits`` and killed past ``tool_timeout_s``) makes each episode a
tool-calling one (:mod:`.tool_env`); it needs the model's
tokenizer and chat template (``tokenizer_path``).

Environments: ``environment_factory=MyEnv`` (Python; or ``{name: MyEnv, ...}``, each row's
``environment`` column picking one) / ``environment: my_envs:MyEnv`` (YAML), TRL's contract: one
instance per trajectory, ``reset(**row)`` whose string extends the prompt, its public methods as
tools, its optional ``get_reward()`` one more reward named after the class with weight 1
(:mod:`.environments`: the instance lives in a worker process of its own). ``reward: null`` leaves
the environment's ``get_reward`` as the only reward.

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

Split: with ``eval_dataset`` (Python: anything ``path`` takes; YAML: ``val_path``, a file) its rows
are the held-out tasks (:meth:`validation_tasks`) and every row of ``path`` trains; without it the
rows whose index hashes below ``val_fraction`` (default 0.1) are held out. Both is a ConfigError: a
second held-out set taken from the training rows is never what a separate eval file meant.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ...core.errors import ConfigError
from ...core.options import strict_options
from ...core.protocols import STEP_TIMEOUT_S
from ...core.types import WeightedReward
from ..chat import ChatRenderer
from ..codec import ByteCodec
from ..selection import held_out, pick
from ..tokens import load_tokenizer
from ..tools.confine import WorkerLimits, confinement
from ..tools.conversation import TurnBudget, turn_token_cap
from ..tools.python_tools import InThreadToolHandler, python_tools
from .conventions import RewardInput
from .env import DatasetEnv, DatasetTask
from .environments import EnvironmentClass, EnvironmentEpisode, EpisodeLimits, environment_classes
from .reward_sum import RewardSum
from .rewards import REWARD_TIMEOUT_S
from .rows import DatasetRowError, read_rows
from .tool_env import DatasetToolEnv

__all__ = ["DatasetTasks", "load_rows"]

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


@strict_options
class DatasetTasks:
    """Args:
    path: the data (see the module docstring): a file, a directory, a ``datasets.Dataset`` or a list
        of dicts. split: the split of a DatasetDict.
    fields: name -> column, renames (every column reaches the rewards anyway); ``prompt`` is required.
    reward: a registered name, ``{name: ..., **kwargs}``, ``{function: "module:callable"}`` (see
        :mod:`.rewards`), or a list of them. reward_weights: one weight per reward (default 1 each).
    tools: functions (Python), ``module:function`` names or ``{function, name, description, parameters}``
        mappings.
        tool_timeout_s: the deadline of one call. tool_parser: the call format (``hermes``).
        max_tool_result_chars: each result is clipped to this. end_on_answer: a turn without a
        call ends the episode (else a reminder naming the tools). template_kwargs: chat template
        options (``{enable_thinking: false}``). worker_limits: how the workers of the tools and of
        the rewards that run in one are confined (:class:`~..tools.WorkerLimits` or a mapping of
        its fields: ``{memory_bytes: ..., require_sandbox: true}``).
    max_turns, max_action_tokens: episode bounds. feedback / success_reward: multi-turn retries.
    system_prompt: an optional system message. tokenizer_path / chat_template / use_chat_template:
        rendering (module docstring). val_fraction: held-out share (by row index; default 0.1, 0 with
        an eval set). eval_dataset / val_path: a separate held-out set (module docstring).
    environment_factory / environment: TRL's environment class (module docstring; one of the two).
        reward may then be None (the environment's ``get_reward`` alone).
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
        val_fraction: float | None = None,
        reward_weights: list[float] | None = None,
        tools: list[Any] | None = None,
        tool_timeout_s: float = 10.0,
        tool_parser: str = "hermes",
        max_tool_result_chars: int = 4096,
        end_on_answer: bool = True,
        template_kwargs: dict[str, Any] | None = None,
        eval_dataset: Any = None,
        val_path: str | None = None,
        environment_factory: Any = None,
        environment: str | dict[str, str] | None = None,
        worker_limits: dict[str, Any] | WorkerLimits | None = None,
    ) -> None:
        self.init_args = {k: v for k, v in locals().items() if k != "self"}  # the run config's data.tasks
        problems = []
        if max_turns < 1 or max_action_tokens < 1:
            problems.append(f"max_turns={max_turns} and max_action_tokens={max_action_tokens} must be >= 1")
        if eval_dataset is not None and val_path is not None:
            problems.append("eval_dataset and val_path are the same setting (a held-out set): give one")
        eval_source = eval_dataset if eval_dataset is not None else val_path
        if eval_source is not None and val_fraction:
            problems.append(
                f"val_fraction={val_fraction} with a separate eval set: the eval set is the held-out "
                "set and every training row trains; drop val_fraction (or the eval set)"
            )
        val_fraction = (0.0 if eval_source is not None else 0.1) if val_fraction is None else val_fraction
        if not 0.0 <= val_fraction < 1.0:
            problems.append(f"val_fraction={val_fraction} must be in [0, 1)")
        if environment_factory is not None and environment is not None:
            problems.append(
                "environment_factory and environment are the same setting (TRL's name in Python, the "
                "YAML key): give one"
            )
        self.environments: dict[str | None, EnvironmentClass] = {}
        try:
            self.environments = environment_classes(
                environment_factory if environment is None else environment
            )
        except ConfigError as exc:
            problems.append(str(exc))
        if not tool_timeout_s > 0:
            problems.append(f"tool_timeout_s={tool_timeout_s} must be > 0 seconds")
        mapping = {"prompt": "prompt", **(fields or {})}
        if None not in self.environments and self.environments:
            mapping.setdefault("environment", "environment")  # each row names its environment
        self.worker_limits = WorkerLimits()
        try:
            self.worker_limits = WorkerLimits.of(worker_limits)
        except ConfigError as exc:
            problems.append(str(exc))
        reward_sum: RewardSum | None = None
        if reward is None:
            if not any(e.has_reward for e in self.environments.values()):
                problems.append("reward=None needs an environment with get_reward(); give a reward otherwise")
            elif reward_weights is not None:
                problems.append("reward_weights weigh the reward functions; with reward=None there are none")
        else:
            try:
                reward_sum = RewardSum(reward, reward_weights, self.worker_limits)
            except ConfigError as exc:
                problems.append(str(exc))
        data = read_rows(path, split)
        held = read_rows(eval_source, split) if eval_source is not None else None
        missing = []
        for rows in (data, held):
            if rows is None:
                continue
            lacking = [
                f"{name} -> column {col!r}" for name, col in mapping.items() if col not in rows.columns
            ]
            if lacking:
                problems.append(
                    f"{rows.origin!r} lacks mapped columns: {', '.join(lacking)} "
                    f"(columns: {list(rows.columns)})"
                )
            missing += lacking
        columns = [*mapping, *(c for c in data.columns if c not in mapping)]
        if reward_sum is not None and not missing:
            problems.extend(reward_sum.signature_problems(columns, repr(data.origin)))
            if held is not None:
                held_columns = [*mapping, *(c for c in held.columns if c not in mapping)]
                problems.extend(reward_sum.signature_problems(held_columns, repr(held.origin)))
        self.tools = []
        if tools or self.environments:
            if not tokenizer_path or not use_chat_template:
                what = "tools" if tools else "an environment (its methods are tools)"
                problems.append(
                    f"{what} need the model's chat template: set tokenizer_path (the model's directory)"
                )
            try:
                self.tools = python_tools(tools or [], tool_timeout_s)
            except ConfigError as exc:
                problems.append(str(exc))
        if (
            self.tools
            or self.environments
            or (reward_sum is not None and any(r.path for r in reward_sum.rewards))
        ):
            try:  # a host that cannot confine the user's functions: warned, or (require_sandbox) refused here
                confinement(self.worker_limits)
            except ConfigError as exc:
                problems.append(str(exc))
        problems += self._environment_problems([data, held], mapping.get("environment"))
        problems += self._unconfined_problems()
        if problems:
            raise ConfigError("DatasetTasks: " + "\n".join(problems))
        self.reward_sum = reward_sum
        self.tool_parser = tool_parser
        self.episode_limits = EpisodeLimits(
            tool_timeout_s, REWARD_TIMEOUT_S, max_tool_result_chars, self.worker_limits
        )  # carried whole to each episode's environment (environments.py)
        self.max_tool_result_chars, self.end_on_answer = max_tool_result_chars, end_on_answer
        self.path = data.origin
        self.eval_path = held.origin if held is not None else None
        self.fields, self.reward_spec = mapping, reward
        self.max_turns, self.max_action_tokens = max_turns, max_action_tokens
        self.feedback, self.success_reward, self.system_prompt = feedback, success_reward, system_prompt
        self.val_fraction = val_fraction
        self.columns = tuple(columns)

        def task(i: int, r: dict[str, Any], columns: tuple[str, ...], held_out: bool = False) -> DatasetTask:
            return DatasetTask(
                i, {**{c: r.get(c) for c in columns}, **{n: r.get(c) for n, c in mapping.items()}}, held_out
            )

        self.rows = [task(i, r, data.columns) for i, r in enumerate(data.rows)]
        self.eval_rows = (
            [task(i, r, held.columns, True) for i, r in enumerate(held.rows)] if held is not None else []
        )
        self._unscorable_warned = threading.Lock()  # taken once: the first unscorable completion is warned
        self.renderer = (
            ChatRenderer(tokenizer_path, chat_template, template_kwargs)
            if tokenizer_path and use_chat_template
            else None
        )
        self.tokenizer_path = tokenizer_path
        self.codec = ByteCodec() if tokenizer_path is None else None
        self.turn_budget: TurnBudget | None = None
        if (self.tools or self.environments) and self.renderer is not None:
            chars, calls = TurnBudget().max_chars, TurnBudget().max_calls
            cap = turn_token_cap(self.renderer, self.tool_schemas(), chars, calls)
            self.turn_budget = TurnBudget(max_calls=calls, max_chars=chars, max_tokens=cap)
            turn_s = (self.turn_budget.deadline_s or 0.0) + tool_timeout_s  # a call may start at the deadline
            if turn_s > STEP_TIMEOUT_S:
                log.warning(
                    "DatasetTasks: a tool turn may take %g s (its %g s deadline + tool_timeout_s %g), past "
                    "the engines' default step_timeout_s of %g s: raise the engine's step_timeout_s above "
                    "it, or such turns fail their trajectory",
                    turn_s,
                    self.turn_budget.deadline_s,
                    tool_timeout_s,
                    STEP_TIMEOUT_S,
                )
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
        """The eval set's rows when there is one, else the held-out share of ``path``'s rows."""
        if self.eval_path is not None:
            return list(self.eval_rows)
        return [t for t in self.rows if self._held_out(t)]

    def tasks(self, step: int, num_groups: int, seed: int) -> list[DatasetTask]:
        return pick([t for t in self.rows if not self._held_out(t)] or self.rows, step, num_groups, seed)

    @property
    def reward_names(self) -> tuple[str, ...]:
        """The names each reward is logged under (``rollout/reward/{name}_mean``): the reward
        functions', then each environment class's with ``get_reward`` (TRL's order)."""
        own = self.reward_sum.names if self.reward_sum is not None else ()
        return own + tuple(dict.fromkeys(e.name for e in self.environments.values() if e.has_reward))

    def origin(self, task: DatasetTask) -> str:
        """The file (or in-memory data) the task's row came from, for messages."""
        return str(self.eval_path) if task.held_out else self.path

    def environment_of(self, task: DatasetTask) -> EnvironmentClass | None:
        """The task's environment class (None: a plain tool episode)."""
        if not self.environments:
            return None
        if None in self.environments:
            return self.environments[None]
        return self.environments[task.row["environment"]]

    def tool_schemas(self) -> list[dict[str, Any]]:
        """Every tool any episode may offer (``tools`` and each environment's methods), once each: the
        turn budget's markup is counted over all of them."""
        schemas = {t.name: t.schema() for t in self.tools}
        for env in self.environments.values():
            for name, description, parameters in env.methods:
                schemas.setdefault(
                    name,
                    {
                        "type": "function",
                        "function": {"name": name, "description": description, "parameters": parameters},
                    },
                )
        return list(schemas.values())

    def _unconfined_problems(self) -> list[str]:
        """Tools and environment classes no worker can import run in the engine's process, unconfined:
        refused with ``worker_limits.require_sandbox``, else warned once here."""
        names = [f"tool {t.name}" for t in self.tools if isinstance(t.handler, InThreadToolHandler)]
        names += [f"environment {e.name}" for e in self.environments.values() if e.path is None]
        if not names:
            return []
        why = (
            f"{', '.join(names)}: no worker can import it (defined in __main__ or in a function), so it runs "
            "in a thread of the engine's process, with its deadline but not confined"
        )
        if self.worker_limits.require_sandbox:
            return [
                f"{why}; worker_limits.require_sandbox refuses that. Fix: define it in a module of yours "
                "(my_agent.py) and import it from there"
            ]
        log.warning("DatasetTasks: %s. Define it in a module of yours to run it in a confined worker.", why)
        return []

    def _environment_problems(self, data: list[Any], column: str | None) -> list[str]:
        """Tool names that collide, an episode without tools, rows naming no known environment."""
        problems = []
        own = [t.name for t in self.tools]
        for env in self.environments.values():
            clash = sorted(set(own) & set(env.tool_names()))
            if clash:
                problems.append(
                    f"environment {env.name}'s methods {clash} have the names of tools in tools=; "
                    "rename one of them (a call must name one tool)"
                )
            if not own and not env.methods:
                problems.append(
                    f"environment {env.name} has no public method and tools= is empty: an episode "
                    "needs a tool (get_reward sees the completion only through the calls)"
                )
        if column is not None:
            names = [k for k in self.environments if k is not None]
            for rows in data:
                if rows is None:
                    continue
                bad = sorted(
                    {str(r.get(column)) for r in rows.rows if r.get(column) not in self.environments}
                )
                if bad:
                    problems.append(
                        f"{rows.origin!r}: column {column!r} names environments {bad[:5]} that are not "
                        f"among environment_factory's {names}"
                    )
        return problems

    def messages_of(self, task: DatasetTask) -> list[dict[str, Any]]:
        """The row's prompt as messages: a string becomes one user message; a list of messages is
        kept. ``system_prompt`` goes first unless the row has its own system message."""
        prompt = task.row["prompt"]
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}]
        else:
            ok = (
                isinstance(prompt, list)
                and prompt
                and all(
                    isinstance(m, dict)
                    and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)
                    for m in prompt
                )
            )
            if not ok:
                raise DatasetRowError(
                    f"row {task.index} of {self.origin(task)!r}: prompt must be a string or a list of "
                    f"{{'role': ..., 'content': <string>}} messages, got {str(prompt)[:120]}"
                )
            messages = [dict(m) for m in prompt]
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def grade(
        self, task: DatasetTask, inp: RewardInput, episode: EnvironmentEpisode | None = None
    ) -> WeightedReward:
        """The rewards' weighted sum for ``inp`` (with ``episode``'s ``get_reward`` as one more reward of
        weight 1, TRL's ``environment_factory``); the first unscorable completion is warned with its row."""
        value = (
            self.reward_sum.score(inp)
            if self.reward_sum is not None
            else WeightedReward(0.0, (), None, unscorable=True)
        )
        if episode is not None and episode.env.has_reward:
            value = _with_environment_reward(value, episode)
        if value.unscorable and self._unscorable_warned.acquire(blocking=False):
            row = {k: (v if len(repr(v)) <= 200 else repr(v)[:197] + "...") for k, v in task.row.items()}
            log.warning(
                "Every reward returned None for a completion of row %d of %s (unscorable: it leaves its "
                "group's mean and std and its advantage is 0; counted in rollout/unscorable_fraction, not "
                "warned again). Row: %s; completion: %.200r. Make sure at least one reward scores each row.",
                task.index,
                self.origin(task),
                row,
                inp.completion,
            )
        return value

    def feedback_tokens(self) -> int:
        """A feedback turn's observation, at most: the end of turn (when the engine cut the turn)
        and the feedback message as :meth:`DatasetEnv.step` renders it (it cuts there)."""
        if self._feedback_tokens is None:
            if self.renderer is not None:
                history = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
                self._feedback_tokens = 1 + len(self.renderer.observation_ids(history, self.feedback))
            else:
                encode = (
                    self.codec.encode
                    if self.codec is not None
                    else lambda t: self._plain_tokenizer().encode(t, add_special_tokens=False)
                )
                self._feedback_tokens = max(
                    len(encode("\n" + self.feedback + "\n")), len(encode(self.feedback + "\n"))
                )
        return self._feedback_tokens

    def max_episode_tokens(self) -> int:
        """A bound on one episode's tokens whatever the policy writes (the memory planner's): the
        longest prompt of :attr:`rows` as ``reset`` renders it, ``max_turns`` actions of at most
        ``max_action_tokens`` (end of turn included), and an observation after each turn (tools: at
        most the turn budget's ``max_tokens``, the last turn's included) or after each turn but the
        last (feedback: :meth:`feedback_tokens`). Renders every row once, then cached."""
        if self._episode_bound is None:
            prompt = 0
            for task in [*self.rows, *self.eval_rows]:
                try:
                    env = self.make_env(task, 0)
                    prompt = max(
                        prompt, env.prompt_bound() if isinstance(env, DatasetToolEnv) else len(env.reset())
                    )
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
        nulls = [name for name in self.fields if task.row.get(name) is None]
        if nulls:
            raise DatasetRowError(
                f"row {task.index} of {self.origin(task)!r} has no value for mapped field(s) {nulls}"
            )
        if self.tools or self.environments:
            return DatasetToolEnv(self, task)
        return DatasetEnv(self, task)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_unscorable_warned"] = None  # a lock does not pickle; each process warns once
        state["init_args"] = {}  # the run config's copy (in-memory rows too) stays in the learner
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._unscorable_warned = threading.Lock()


def _with_environment_reward(value: WeightedReward, episode: EnvironmentEpisode) -> WeightedReward:
    """``value`` with the episode's ``get_reward()`` added (weight 1, named after the class): None
    declines as any reward's None does; a failure is the trajectory's, the given values kept."""
    failure = None
    try:
        reward = episode.reward()
    except RuntimeError as exc:
        reward, failure = None, f"RewardError: {exc}"
    parts = [*value.parts, *([(episode.env.name, reward)] if reward is not None else [])]
    if value.failure is not None or failure is not None:
        return WeightedReward(0.0, parts, value.failure or failure)
    if reward is None:
        return value
    return WeightedReward((0.0 if value.unscorable else float(value)) + reward, parts)
