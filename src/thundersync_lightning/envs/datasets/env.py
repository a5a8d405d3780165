"""One episode over one dataset row: the task payload and the environment
(single- or multi-turn, graded by the reward)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...core.types import StepResult, WeightedReward
from .conventions import RewardError, RewardInput

if TYPE_CHECKING:  # annotations only: the source builds this environment
    from .source import DatasetTasks

__all__ = ["DatasetTask", "DatasetEnv"]


@dataclass(frozen=True, slots=True)
class DatasetTask:
    """One row: its index and its columns (``fields`` renames applied: name -> value); ``held_out``:
    a row of the separate eval set (its index counts there)."""

    index: int
    row: dict[str, Any]
    held_out: bool = False


class DatasetEnv:
    """One episode over one row (see :class:`DatasetTasks`)."""

    def __init__(self, source: DatasetTasks, task: DatasetTask) -> None:
        self.source, self.task = source, task
        self.messages: list[dict[str, str]] = []
        self.answers: list[str] = []
        self.last_reward: float | None = None
        self.completion_ids: list[int] = []  # the tokens after the prompt (TRL's completion_ids)
        self._prompt_messages = 0

    @property
    def prompt(self) -> Any:
        """The row's prompt as given (a string, or a list of messages)."""
        return self.task.row["prompt"]

    def reset(self) -> tuple[int, ...]:
        src = self.source
        self.messages = src.messages_of(self.task)
        self._prompt_messages = len(self.messages)
        self.answers, self.last_reward, self.completion_ids = [], None, []
        if src.renderer is not None:
            return src.renderer.prompt_ids(self.messages)
        text = self.prompt if isinstance(self.prompt, str) else "\n".join(m["content"] for m in self.messages)
        return self._encode(text + "\n")

    def _encode(self, text: str) -> tuple[int, ...]:
        if self.source.codec is not None:
            return tuple(self.source.codec.encode(text))
        return tuple(self.source._plain_tokenizer().encode(text, add_special_tokens=False))

    def _decode(self, ids: list[int]) -> str:
        src = self.source
        if src.renderer is not None:
            return src.renderer.decode(ids)
        if src.codec is not None:
            return src.codec.decode(ids)
        return str(src._plain_tokenizer().decode(ids, skip_special_tokens=True))

    def step(self, action: Any) -> StepResult:
        ids, stop = list(action), self.source.stop_token
        self.completion_ids.extend(ids)
        closed = stop in ids
        if closed:
            ids = ids[: ids.index(stop)]
        text = self._decode(ids)
        self.answers.append(text)
        self.messages.append({"role": "assistant", "content": text})
        if len(self.answers) >= self.source.max_turns:
            return StepResult((), True)
        grade = self._grade(text)
        if grade.failure is not None:  # grading a turn failed: the episode fails, as a reward error
            raise RewardError(grade.failure.removeprefix("RewardError: "))
        self.last_reward = grade
        if not grade.unscorable and grade >= self.source.success_reward:
            return StepResult((), True)
        src = self.source
        if src.renderer is not None:
            obs = src.renderer.observation_ids(self.messages, src.feedback)
            obs = (obs if closed else (stop, *obs))[
                : src.feedback_tokens()
            ]  # closes a turn cut at max_action_tokens
        else:
            obs = self._encode(("" if closed else "\n") + src.feedback + "\n")
        self.messages.append({"role": "user", "content": src.feedback})
        self.completion_ids.extend(obs)
        return StepResult(obs, False)

    def _grade(self, completion: str) -> WeightedReward:
        messages = tuple(self.messages[self._prompt_messages :])  # the answer graded is the last one
        inp = RewardInput(
            self.prompt, completion, self.task.row, messages, tuple(self.completion_ids), len(self.answers)
        )
        return self.source.grade(self.task, inp)

    def verdict(self) -> float:
        if not self.answers:
            return 0.0
        if self.last_reward is not None and len(self.answers) < self.source.max_turns:
            return self.last_reward  # the episode ended on a success already graded
        return self._grade(self.answers[-1])

    def close(self) -> None:
        pass
