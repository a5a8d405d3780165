"""One episode of a dataset row with the user's own tools (``DatasetTasks(tools=[...])``).

The row's prompt (a string, or a list of messages kept as they are, system prompt included) is
rendered with the tools' schemas by the model's chat template. Each turn, the calls the model
makes run (:class:`~..tools.ToolConversation`: Python tools in worker processes of the episode's
own, confined and with a deadline, stopped by :meth:`DatasetToolEnv.close`) and their results
follow as ``tool`` messages; the first turn without a call is the answer and ends the episode (TRL's tool loop). With ``end_on_answer=False`` a turn without a call gets a
reminder naming the tools and the episode goes on to ``max_turns``. The verdict is the weighted
reward of the answer (the last assistant turn's text, ``<think>`` included, special tokens not).
A turn runs within the source's ``turn_budget`` (calls, deadline, characters and tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.types import StepResult
from ..tools import ToolConversation, ToolWorkers

if TYPE_CHECKING:
    from .env import DatasetTask
    from .source import DatasetTasks

__all__ = ["DatasetToolEnv"]


class DatasetToolEnv:
    """See the module docstring."""

    def __init__(self, source: DatasetTasks, task: DatasetTask) -> None:
        assert source.renderer is not None and source.tools
        self.source, self.task = source, task
        self.conversation = ToolConversation(source.renderer, source.tools, source.tool_parser,
                                             source.max_tool_result_chars, source.turn_budget)
        self.answer: str | None = None
        self.last_text = ""
        # this episode's tool workers: what a call changes in the user's module is seen by this
        # episode's later calls only (no process starts before the first call)
        self.workers = ToolWorkers(max_idle=1, limits=source.worker_limits)

    @property
    def prompt(self) -> Any:
        return self.task.row["prompt"]

    def reset(self) -> tuple[int, ...]:
        self.answer, self.last_text = None, ""
        return self.conversation.start(self.source.messages_of(self.task))

    def step(self, action: Any) -> StepResult:
        renderer = self.source.renderer
        assert renderer is not None
        ids = list(action)
        eot = renderer.end_of_turn
        text, parsed = self.conversation.read(ids[: ids.index(eot)] if eot in ids else ids)  # never raises
        self.last_text = text
        if self.source.end_on_answer and not parsed.calls:
            self.answer = text
            return StepResult((), True)
        turn = self.conversation.respond(ids, self.workers)
        return StepResult(turn.observation, turn.done, turn.calls, turn.invalid, turn.errors, turn.timeouts,
                          turn.first_error)

    def verdict(self) -> float:
        answer = self.answer if self.answer is not None else self.last_text
        return self.source.reward_sum(self.prompt, answer, self.task.row)

    def close(self) -> None:
        self.workers.close()
