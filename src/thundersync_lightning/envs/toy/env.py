"""One episode of the guessing game (rules: :mod:`.source`): the task payload and the environment."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ...core.types import StepResult

__all__ = ["GuessingTask", "GuessingGameEnv"]


@dataclass(frozen=True, slots=True)
class GuessingTask:
    """The task payload of one group: its secret digit."""

    secret: int


class GuessingGameEnv:
    """One episode of the guessing game (see the module docstring for the rules)."""

    def __init__(
        self, secret: int, num_digits: int, max_turns: int, latency_s: float = 0.0, context_tokens: int = 0
    ) -> None:
        self.secret = secret
        self.context_tokens = context_tokens
        self.num_digits = num_digits
        self.max_turns = max_turns
        self.latency_s = latency_s  # simulated verdict latency of this trajectory
        self.found = False
        self.turns = 0

    # token ids
    @property
    def higher(self) -> int:
        return self.num_digits

    @property
    def lower(self) -> int:
        return self.num_digits + 1

    @property
    def ok(self) -> int:
        return self.num_digits + 2

    @property
    def bad(self) -> int:
        return self.num_digits + 3

    @property
    def start(self) -> int:
        return self.num_digits + 4

    def reset(self) -> Sequence[int]:
        self.found = False
        self.turns = 0
        return (self.start,) * (self.context_tokens + 1)

    def step(self, action: Sequence[int]) -> StepResult:
        self.turns += 1
        guess = action[-1] if action else -1
        if not 0 <= guess < self.num_digits:
            answer = self.bad
        elif guess == self.secret:
            self.found = True
            answer = self.ok
        else:
            answer = self.higher if guess < self.secret else self.lower
        return StepResult((answer,), self.found)

    def verdict(self) -> float:
        """1.0 if the secret was found, after the simulated test latency."""
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        return 1.0 if self.found else 0.0

    def close(self) -> None:
        pass
