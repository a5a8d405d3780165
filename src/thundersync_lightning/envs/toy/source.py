"""A learnable toy agent task: guess the secret digit with HIGHER/LOWER feedback.

Each group has one secret digit ``s`` in ``0..num_digits-1``. The prompt is ``[START]``; on
each turn the agent emits one token (its guess) and the environment answers:

    guess == s   -> OK      (episode done)
    guess <  s   -> HIGHER
    guess >  s   -> LOWER
    not a digit  -> BAD

for at most ``max_turns`` turns. The verdict is 1.0 if the secret was found, else 0.0. With
``max_turns >= ceil(log2(num_digits + 1))`` a binary search always wins (4 turns cover up to 15
digits; the default 8 leaves slack, so several strategies win and learning is quick and stable),
while a randomly initialised model wins about 20% of the time: the reward has room to rise and
a tiny model learns it by GRPO on a CPU in a few hundred steps.

``context_tokens = n`` puts n copies of START before it (the prompt is ``[START] * (n + 1)``): a
shared, uninformative task statement that makes every trajectory n tokens longer, standing in for
the repository context a coding agent reads, so the learner's work per trajectory is set by tokens
(compute) rather than by per-call overheads. The game and its verdicts are unchanged.

Vocabulary layout (token ids): digits ``0..num_digits-1``, then HIGHER, LOWER, OK, BAD, START;
``vocab_size >= num_digits + 5``. ``GuessingGameTasks.decode(ids)`` writes ids as these words.

SIMULATED test latency: the verdict sleeps for a per-trajectory latency drawn (seeded by the
trajectory's seed, so reproducible) from a long-tailed distribution, standing in for the test
run of a coding task:

    lognormal:  L = median * exp(sigma * Z),              Z ~ N(0, 1)
    pareto:     L = median * 2**(-1/alpha) * X,            X ~ Pareto(alpha) on [1, inf)
    (both have median ``latency_median_s``), capped at ``latency_max_s``.

Default calibration (median 0.03 s, sigma 1.0): at 16 groups x 8 samples on the embedded
engine's 32 verdict threads, the verdicts' makespan per step is chosen to be about the toy model's
learner work for the step's 128 trajectories, so that a synchronous learner (wait for every reward,
then backward) idles about half of each step. Tune ``latency_median_s`` (scale) and
``latency_sigma`` (tail weight) to move that balance.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ...core.errors import ConfigError
from ...core.options import strict_options
from ...core.types import ModelSpec, derive_seed
from ..tiny_model import toy_model_spec
from .env import GuessingGameEnv, GuessingTask

__all__ = ["GuessingGameTasks"]


@strict_options
@dataclass(frozen=True, slots=True)
class GuessingGameTasks:
    """Task source of the guessing game (constructible from YAML).

    Attributes:
        num_digits: size of the secret range (digit tokens 0..num_digits-1).
        max_turns: guesses per episode.
        latency: distribution of the SIMULATED verdict latency ("none" to disable).
        latency_median_s: its median, seconds.
        latency_sigma: log-normal shape (tail weight).
        latency_pareto_alpha: Pareto tail index (smaller: heavier).
        latency_max_s: cap on one latency.
        seed: offset mixed into every task and latency draw.
        context_tokens: START tokens before the prompt's own (module docstring); 0: none.
    """

    num_digits: int = 8
    max_turns: int = 4
    latency: Literal["lognormal", "pareto", "none"] = "lognormal"
    latency_median_s: float = 0.03
    latency_sigma: float = 1.0
    latency_pareto_alpha: float = 1.5
    latency_max_s: float = 5.0
    seed: int = 0
    context_tokens: int = 0
    max_action_tokens: int = field(default=1, init=False)
    stop_token: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        p: list[str] = []
        if self.num_digits < 2:
            p.append(f"num_digits={self.num_digits}: must be >= 2")
        if self.max_turns < 1:
            p.append(f"max_turns={self.max_turns}: must be >= 1")
        if self.latency not in ("lognormal", "pareto", "none"):
            p.append(f"latency={self.latency!r}: use 'lognormal', 'pareto' or 'none'")
        if self.latency_median_s < 0 or self.latency_sigma < 0 or self.latency_max_s < 0:
            p.append("latency_median_s, latency_sigma and latency_max_s must be >= 0")
        if self.context_tokens < 0:
            p.append(f"context_tokens={self.context_tokens}: must be >= 0")
        if not self.latency_pareto_alpha > 0:
            p.append(f"latency_pareto_alpha={self.latency_pareto_alpha}: must be > 0")
        if p:
            raise ConfigError("GuessingGameTasks is invalid:\n  - " + "\n  - ".join(p))

    @property
    def vocab_size(self) -> int:
        """Smallest vocabulary holding the layout (digits, HIGHER, LOWER, OK, BAD, START)."""
        return self.num_digits + 5

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids as text: digits as themselves, then HIGHER, LOWER, OK, BAD, START; space-separated."""
        words = ("HIGHER", "LOWER", "OK", "BAD", "START")  # ids num_digits .. num_digits + 4

        def word(i: int) -> str:
            if 0 <= i < self.num_digits:
                return str(i)
            k = i - self.num_digits
            return words[k] if 0 <= k < len(words) else f"<{i}>"

        return " ".join(word(int(i)) for i in ids)

    def model_spec(self) -> ModelSpec:
        """:func:`toy_model_spec` with the vocabulary rounded up to a multiple of 8 and positions for
        the longest episode (a multiple of 64)."""
        spec = toy_model_spec(vocab_size=8 * math.ceil(self.vocab_size / 8))
        positions = 64 * math.ceil(self.max_episode_tokens() / 64)
        if positions <= spec.config["max_position_embeddings"]:
            return spec
        return ModelSpec(spec.model_type, {**spec.config, "max_position_embeddings": positions})

    def tasks(self, step: int, num_groups: int, seed: int) -> Sequence[GuessingTask]:
        """Group g's secret depends on (seed, step, g) only, so any split of groups agrees."""
        return [
            GuessingTask(derive_seed(seed + self.seed, step, g, -1) % self.num_digits)
            for g in range(num_groups)
        ]

    def validation_tasks(self) -> Sequence[GuessingTask]:
        """Every secret once. The game has no held-out split (its tasks are the secrets): validation
        measures the policy on each of them."""
        return [GuessingTask(s) for s in range(self.num_digits)]

    def max_episode_tokens(self) -> int:
        """The prompt, then per turn one guess and one answer (an upper bound on an episode)."""
        return 1 + self.context_tokens + self.max_turns * (self.max_action_tokens + 1)

    def sample_latency(self, seed: int) -> float:
        """The simulated verdict latency of the trajectory with ``seed`` (seconds)."""
        if self.latency == "none" or self.latency_median_s == 0:
            return 0.0
        rng = random.Random(seed ^ (self.seed * 0x9E3779B1))
        if self.latency == "lognormal":
            value = self.latency_median_s * math.exp(self.latency_sigma * rng.gauss(0.0, 1.0))
        else:
            alpha = self.latency_pareto_alpha
            value = self.latency_median_s * 2.0 ** (-1.0 / alpha) * rng.paretovariate(alpha)
        return min(value, self.latency_max_s)

    def make_env(self, task: GuessingTask, seed: int) -> GuessingGameEnv:
        return GuessingGameEnv(
            task.secret, self.num_digits, self.max_turns, self.sample_latency(seed), self.context_tokens
        )
