"""A small multi-turn token task and a transformers reference scorer for the vLLM tests.

Vocabulary (32 ids): STOP=1 ends an action, OBS=2 starts an observation, everything else is free.
An episode: prompt ``(3, 4 + group, 5)``; the agent emits up to 4 tokens (stopping after STOP);
the environment answers ``(OBS, 6 + len(action))`` and the episode ends after ``turns`` actions
(``done``). The verdict is the number of STOP-terminated actions. ``gates[group_index]``, when
set, makes that group's first step wait for the event (to force a completion order).
``Task.fails_at`` makes ``make_env`` or every ``step`` raise; ``TurnTasks.made`` / ``closed`` are
released once per environment created / closed (so tests can count them).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from thundersync_lightning.core.types import ModelSpec, StepResult, Trajectory

STOP, OBS = 1, 2
TEMPERATURE = 0.8

TINY_QWEN3 = ModelSpec(
    model_type="qwen3",
    config={
        "vocab_size": 32,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": 128,
        "tie_word_embeddings": True,
    },
)

TOY_VLLM_MODEL = {**TINY_QWEN3.config, "vocab_size": 16, "max_position_embeddings": 64}
"""TINY_QWEN3 for the toy guessing game (GRPOPolicy's ``config`` in the vLLM fits)."""


@dataclass(frozen=True, slots=True)
class Task:
    group_index: int
    turns: int = 3
    fails_at: Literal["make_env", "step"] | None = None


class TurnEnv:
    def __init__(self, task: Task, gate: threading.Event | None, closed: threading.Semaphore) -> None:
        self.task = task
        self.gate = gate
        self.closed = closed
        self.turns = 0
        self.stops = 0

    def reset(self) -> Sequence[int]:
        return (3, 4 + self.task.group_index % 20, 5)

    def step(self, action: Sequence[int]) -> StepResult:
        if self.task.fails_at == "step":
            raise ValueError("tool crashed")
        if self.gate is not None and self.turns == 0 and not self.gate.wait(timeout=120):
            raise TimeoutError("gate never opened")
        self.turns += 1
        self.stops += int(bool(action) and action[-1] == STOP)
        return StepResult((OBS, 6 + len(action)), self.turns >= self.task.turns)

    def verdict(self) -> float:
        return float(self.stops)

    def close(self) -> None:
        self.closed.release()


@dataclass
class TurnTasks:
    max_turns: int = 3
    max_action_tokens: int = 4
    stop_token: int | None = STOP
    gates: dict[int, threading.Event] = field(default_factory=dict)
    made: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    closed: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    def tasks(self, step: int, num_groups: int, seed: int) -> Sequence[Task]:
        return [Task(g) for g in range(num_groups)]

    def make_env(self, task: Task, seed: int) -> TurnEnv:
        if task.fails_at == "make_env":
            raise RuntimeError("cannot build the sandbox")
        env = TurnEnv(task, self.gates.get(task.group_index), self.closed)
        self.made.release()
        return env


def make_learner(seed: int) -> torch.nn.Module:
    """The learner's copy of TINY_QWEN3 with weights drawn from ``seed`` (larger than init, so
    samples are far from uniform)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3", **TINY_QWEN3.config))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return model.eval()


def reference_logprobs(model: torch.nn.Module, traj: Trajectory) -> list[float]:
    """log_softmax(logits / T) of the scored tokens, from a full-sequence transformers forward."""
    tokens = torch.tensor([traj.tokens])  # (1, L)
    with torch.no_grad():
        logp = torch.log_softmax(model(tokens).logits[0].float() / TEMPERATURE, dim=-1)  # (L, V)
    mask = traj.scored_mask
    return [logp[i - 1, traj.tokens[i]].item() for i in range(1, len(mask)) if mask[i]]
