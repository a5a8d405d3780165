"""The task families' shared toolkit (``envs/selection.py``): one seeded pick and one held-out split.

``EchoTasks`` below is a whole new task family in one file (design.md, "Where a change goes"): a
``TaskSource`` that picks and splits with the toolkit and an ``Environment``; it passes the
extension contract and trains through a fit with no other file touched.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

import lightning as L

import thundersync_lightning  # noqa: F401  registers strategy="thundersync"
from thundersync_lightning.core.contract import check_tasks
from thundersync_lightning.core.types import StepResult, derive_seed
from thundersync_lightning.envs import DatasetTasks
from thundersync_lightning.envs.mutations import is_held_out
from thundersync_lightning.envs.selection import held_out, pick
from thundersync_lightning.envs.toy import toy_model_spec
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.rollout import EmbeddedEngineConfig


def _inline_pick(items, step, num_groups, seed):  # noqa: ANN001, ANN202 - the rule as each family wrote it
    rng = random.Random(derive_seed(seed, step, -1, -1))
    out = []
    while len(out) < num_groups:
        order = list(range(len(items)))
        rng.shuffle(order)
        out.extend(items[i] for i in order[: num_groups - len(out)])
    return out


def _inline_held_out(key: str, val_fraction: float) -> bool:
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") % 10_000
    return h < round(val_fraction * 10_000)


def test_pick_is_the_seeded_permutation_each_family_wrote_cycled_past_the_end():
    items = list("abcdefg")
    for step, groups, seed in [(0, 3, 0), (5, 7, 1), (2, 20, 42)]:
        assert pick(items, step, groups, seed) == _inline_pick(items, step, groups, seed)
    assert sorted(pick(items, 3, 7, 0)) == items  # one permutation when as many are asked as exist
    assert pick(items, 3, 7, 0) != pick(items, 4, 7, 0)


def test_the_held_out_split_keeps_every_membership_and_each_family_uses_it(tmp_path):
    keys = [f"task-{i}" for i in range(500)] + [str(i) for i in range(500)]
    for fraction in (0.1, 0.25, 0.5):
        assert [held_out(k, fraction) for k in keys] == [_inline_held_out(k, fraction) for k in keys]
    assert [k for k in ("0", "1", "2", "3", "4", "5", "6", "7") if held_out(k, 0.5)] == [
        k for k in ("0", "1", "2", "3", "4", "5", "6", "7") if _inline_held_out(k, 0.5)
    ]
    assert all(is_held_out(k, 0.25) == held_out(k, 0.25) for k in keys)  # mutations: by task id
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(40)))
    data = DatasetTasks(str(rows), fields={"answer": "answer"}, reward="exact_match", val_fraction=0.25)
    assert [t.index for t in data.validation_tasks()] == [i for i in range(40) if held_out(str(i), 0.25)]


# -- a new task family in one file --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EchoTask:
    token: int


class EchoEnv:
    """Say the prompt's token back: reward 1 when the first action starts with it."""

    def __init__(self, task: EchoTask) -> None:
        self.task, self.said = task, None

    def reset(self) -> Sequence[int]:
        return (self.task.token,)

    def step(self, action: Sequence[int]) -> StepResult:
        self.said = tuple(action)
        return StepResult(observation=(), done=True)

    def verdict(self) -> float:
        return float(bool(self.said) and self.said[0] == self.task.token)

    def close(self) -> None:
        pass


class EchoTasks:
    """Tokens 0..7; a quarter held out by the toolkit's split, each step's picked by its pick."""

    max_turns = 1
    max_action_tokens = 2
    stop_token = None
    vocab_size = 8

    def __init__(self, val_fraction: float = 0.25) -> None:
        self.val_fraction = val_fraction
        self.all_tasks = [EchoTask(t) for t in range(self.vocab_size)]

    def tasks(self, step: int, num_groups: int, seed: int) -> list[EchoTask]:
        train = [t for t in self.all_tasks if not held_out(str(t.token), self.val_fraction)]
        return pick(train, step, num_groups, seed)

    def validation_tasks(self) -> list[EchoTask]:
        return [t for t in self.all_tasks if held_out(str(t.token), self.val_fraction)]

    def make_env(self, task: EchoTask, seed: int) -> EchoEnv:
        return EchoEnv(task)


def test_a_new_task_family_in_one_file_fits_the_contract_and_trains_through_a_fit():
    tasks = EchoTasks()
    assert check_tasks(tasks) == []
    assert {t.token for t in tasks.tasks(0, 8, 0)}.isdisjoint({t.token for t in tasks.validation_tasks()})
    data = RolloutDataModule(tasks=tasks, engine=EmbeddedEngineConfig(num_threads=1, env_workers=2),
                             group_size=2, groups_per_step=2)  # fmt: skip
    trainer = L.Trainer(
        strategy="thundersync", accelerator="cpu", devices=1, max_steps=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(GRPOPolicy(config=dict(toy_model_spec().config)), data)
    trained = trainer.strategy.last_step_stats.trajectories
    assert len(trained) == 4 and all(t.reward in (0.0, 1.0) and t.staleness == 0 for t in trained)
