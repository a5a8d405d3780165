"""One episode of a dataset row with the user's own tools (``DatasetTasks(tools=[...])``).

The row's prompt (a string, or a list of messages kept as they are, system prompt included) is
rendered with the tools' schemas by the model's chat template. Each turn, the calls the model
makes run (:class:`~..tools.ToolConversation`: Python tools in worker processes of the episode's
own, confined and with a deadline, stopped by :meth:`DatasetToolEnv.close`) and their results
follow as ``tool`` messages; the first turn without a call is the answer and ends the episode
(TRL's tool loop). With ``end_on_answer=False`` a turn without a call gets a reminder naming the tools and the
episode goes on to ``max_turns``. The verdict is the weighted
reward of the answer (the last assistant turn's text, ``<think>`` included, special tokens not).
A turn runs within the source's ``turn_budget`` (calls, deadline, characters and tokens). A TRL
reward receives the episode as TRL's tool loop gives it: the assistant and ``tool`` messages after
the prompt, the answer last, and every token after the prompt as ``completion_ids``.

With an environment class (:mod:`.environments`) the episode holds one instance: ``reset`` gives
it the row's columns (``environment`` aside) and appends the string it returns to the last prompt
message, clipped to ``max_tool_result_chars`` (a longer prompt than the bound of
:meth:`prompt_bound` fails the trajectory); its methods join the tools; its ``get_reward()`` joins
the verdict as one more reward, named after the class, weight 1; ``close`` discards the instance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.types import StepResult
from ..tools import ToolConversation, ToolWorkers
from ..tools.conversation import NOTE_TOKENS, clip_text
from .conventions import RewardInput
from .environments import EnvironmentEpisode
from .rows import DatasetRowError

if TYPE_CHECKING:
    from .env import DatasetTask
    from .source import DatasetTasks

__all__ = ["DatasetToolEnv"]


class DatasetToolEnv:
    """See the module docstring."""

    def __init__(self, source: DatasetTasks, task: DatasetTask) -> None:
        env = source.environment_of(task)
        assert source.renderer is not None and (source.tools or env is not None)
        self.source, self.task = source, task
        self.episode = EnvironmentEpisode(env, source.episode_limits) if env is not None else None
        tools = [*source.tools, *(self.episode.tools() if self.episode is not None else [])]
        self.conversation = ToolConversation(
            source.renderer, tools, source.tool_parser, source.max_tool_result_chars, source.turn_budget
        )
        self.answer: str | None = None
        self.last_text = ""
        self.completion_ids: list[int] = []
        self.turns = 0
        self._prompt_messages = 0
        # this episode's tool workers: what a call changes in the user's module is seen by this
        # episode's later calls only (no process starts before the first call)
        self.workers = ToolWorkers(max_idle=1, limits=source.worker_limits)

    @property
    def prompt(self) -> Any:
        return self.task.row["prompt"]

    def reset(self) -> tuple[int, ...]:
        self.answer, self.last_text, self.completion_ids, self.turns = None, "", [], 0
        messages = self.source.messages_of(self.task)
        self._prompt_messages = len(messages)
        if self.episode is None:
            return self.conversation.start(messages)
        row = {
            k: v for k, v in self.task.row.items() if k != "environment" or None in self.source.environments
        }
        try:
            observation = self.episode.reset(row)
        except RuntimeError as exc:  # the row cannot be an episode: counted as a reward error, warned
            raise DatasetRowError(
                f"row {self.task.index} of {self.source.origin(self.task)!r}: {exc}"
            ) from None
        if observation is None:
            return self.conversation.start(messages)
        bound = self.prompt_bound()
        last = messages[-1]
        messages[-1] = {
            **last,
            "content": last["content"] + clip_text(observation, self.source.max_tool_result_chars),
        }
        ids = self.conversation.start(messages)
        if len(ids) > bound:
            raise DatasetRowError(
                f"row {self.task.index} of {self.source.origin(self.task)!r}: the prompt with "
                f"{self.episode.env.name}.reset's text is {len(ids)} tokens, past its bound of "
                f"{bound} (the prompt's own tokens + one per character of max_tool_result_chars)"
            )
        return ids

    def prompt_bound(self) -> int:
        """The most tokens :meth:`reset` returns: the row's prompt with the tools' schemas, plus (with
        an environment) one token per character of ``max_tool_result_chars`` and a cut note for
        ``reset``'s text (the tool results' convention, :func:`~..tools.conversation.turn_token_cap`)."""
        ids = self.conversation.start(self.source.messages_of(self.task))
        if self.episode is None:
            return len(ids)
        return len(ids) + self.source.max_tool_result_chars + NOTE_TOKENS

    def step(self, action: Any) -> StepResult:
        renderer = self.source.renderer
        assert renderer is not None
        ids = list(action)
        self.completion_ids.extend(ids)
        self.turns += 1
        eot = renderer.end_of_turn
        text, parsed = self.conversation.read(ids[: ids.index(eot)] if eot in ids else ids)  # never raises
        self.last_text = text
        if self.source.end_on_answer and not parsed.calls:
            self.answer = text
            return StepResult((), True)
        turn = self.conversation.respond(ids, self.workers)
        self.completion_ids.extend(turn.observation)
        return StepResult(
            turn.observation,
            turn.done,
            turn.calls,
            turn.invalid,
            turn.errors,
            turn.timeouts,
            turn.first_error,
        )

    def verdict(self) -> float:
        answer = self.answer if self.answer is not None else self.last_text
        messages = self.conversation.messages[self._prompt_messages :]
        if self.answer is not None:  # the answer ended the episode: no turn appended it
            messages = [*messages, {"role": "assistant", "content": self.answer}]
        inp = RewardInput(
            self.prompt, answer, self.task.row, tuple(messages), tuple(self.completion_ids), self.turns
        )
        return self.source.grade(self.task, inp, self.episode)

    def close(self) -> None:
        self.workers.close()
        if self.episode is not None:
            self.episode.close()
