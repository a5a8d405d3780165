"""``RolloutDataModule``: tasks, a rollout engine, group size G and groups per step B.

Its dataloader yields :class:`~thundersync_lightning.strategy.RolloutBatch` tickets, one per step;
rollouts are generated inside the step by the strategy (or by ``GRPOPolicy.training_step`` under a
stock strategy), after that step's weights are published. The engine is built in ``setup`` from
the policy's :class:`ModelSpec` and shut down in ``teardown``; each learner process has its own.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from ..core.batches import BatchLoader, RolloutBatch
from ..core.contract import check_engine, check_module, check_tasks, check_vocabulary, raise_contract_problems
from ..core.errors import ConfigError
from ..core.evaluation import ValidationLoader
from ..core.options import strict_options
from ..core.protocols import EngineFactory, RolloutEngine, TaskSource
from .settings import plain_settings

__all__ = ["RolloutDataModule", "EngineFactory", "TaskSourceConfig"]

log = logging.getLogger(__name__)


@runtime_checkable
class TaskSourceConfig(Protocol):
    """The methods of :class:`~thundersync_lightning.core.protocols.TaskSource`, typed loosely for
    configs (see :class:`EngineFactory`). Attributes are checked when the data module is built."""

    def tasks(self, step: Any, num_groups: Any, seed: Any) -> Any: ...

    def make_env(self, task: Any, seed: Any) -> Any: ...


@strict_options
class RolloutDataModule(LightningDataModule):
    """Args:
    tasks: the task source (e.g. ``thundersync_lightning.envs.toy.GuessingGameTasks``).
    engine: an engine configuration with ``build(model_spec, tasks)``.
    group_size: G, trajectories sampled per task.
    groups_per_step: B, groups (tasks) per optimizer step, over all ranks.
    seed: the rollout seed; trajectory seeds derive from (seed, step, group, sample).
    steps_per_epoch: length of an "epoch" (RL has none; it only paces epoch-level hooks).
    val_samples: n, trajectories per held-out task in validation (0: no validation). The held-out
        tasks are the task source's ``validation_tasks()`` (its held-out split, in a fixed order).
    val_tasks: use only the first ``val_tasks`` held-out tasks (None: all of them).
    val_groups: held-out tasks per validation batch (one engine request each).
    val_pass_k: k of ``val/pass_at_k`` (default: ``val_samples``); needs k <= n.
    val_pass_threshold: a trajectory passes when its reward is at least this (and it did not fail).
    val_seed: the sampling seed of validation rollouts (the same at every evaluation).
    dynamic_sampling: DAPO's dynamic sampling, streamed: when every verdict of a group is in and its
        rewards carry no signal (all equal; a lone survivor unless ``singleton="reward"``), the group
        counts nowhere and a replacement group is issued at once from the same weights, until the
        step holds ``groups_per_step`` informative groups or ``max_extra_groups`` replacements were
        issued. Needs ``strategy="thundersync"`` (any mode; every mode issues the same replacements).
    max_extra_groups: the most replacement groups per step, over all ranks (default with
        ``dynamic_sampling``: ``groups_per_step``; each rank replaces its own groups from its share).

    Validation runs in Lightning's validation loop (``val_check_interval``,
    ``check_val_every_n_epoch``, ``limit_val_batches``, ``trainer.validate``) and logs ``val/pass_at_1``,
    ``val/pass_at_k``, ``val/reward_mean``, ``val/turns_mean`` and ``val/failed_fraction``.

    Every option is used; an unknown keyword raises :class:`ConfigError` naming it.
    """

    def __init__(
        self,
        tasks: TaskSourceConfig,
        engine: EngineFactory,
        group_size: int = 8,
        groups_per_step: int = 16,
        seed: int = 0,
        steps_per_epoch: int = 1000,
        val_samples: int = 0,
        val_tasks: int | None = None,
        val_groups: int = 16,
        val_pass_k: int | None = None,
        val_pass_threshold: float = 1.0,
        val_seed: int = 12345,
        dynamic_sampling: bool = False,
        max_extra_groups: int | None = None,
    ) -> None:
        super().__init__()
        problems = []
        if group_size < 1:
            problems.append(f"group_size must be >= 1, got {group_size}")
        if groups_per_step < 1:
            problems.append(f"groups_per_step must be >= 1, got {groups_per_step}")
        if steps_per_epoch < 1:
            problems.append(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
        missing = [m for m in ("tasks", "make_env") if not callable(getattr(tasks, m, None))]
        missing += [a for a in ("max_turns", "max_action_tokens", "stop_token") if not hasattr(tasks, a)]
        if missing:
            problems.append(f"tasks ({type(tasks).__name__}) lacks TaskSource members: {', '.join(missing)}")
        if val_samples < 0:
            problems.append(f"val_samples must be >= 0, got {val_samples}")
        if val_groups < 1:
            problems.append(f"val_groups must be >= 1, got {val_groups}")
        if val_tasks is not None and val_tasks < 1:
            problems.append(f"val_tasks must be >= 1 or None, got {val_tasks}")
        if val_pass_k is not None and not 1 <= val_pass_k <= max(val_samples, 1):
            problems.append(f"val_pass_k={val_pass_k} must be in 1..val_samples ({val_samples})")
        if val_samples > 0 and not callable(getattr(tasks, "validation_tasks", None)):
            problems.append(
                f"val_samples={val_samples} but the task source ({type(tasks).__name__}) has no "
                "validation_tasks() method returning its held-out tasks; add one or set val_samples=0"
            )
        if not isinstance(dynamic_sampling, bool):
            problems.append(f"dynamic_sampling must be True or False, got {dynamic_sampling!r}")
        elif dynamic_sampling and max_extra_groups is not None and max_extra_groups < 1:
            problems.append(f"max_extra_groups must be >= 1 with dynamic_sampling, got {max_extra_groups}")
        elif not dynamic_sampling and max_extra_groups is not None:
            problems.append("max_extra_groups is only used with dynamic_sampling=True")
        if not callable(getattr(engine, "build", None)):
            problems.append(f"engine must have build(model_spec, tasks), got {type(engine).__name__}")
        if problems:
            raise ConfigError("RolloutDataModule: " + "; ".join(problems))
        if val_samples == 0 and getattr(tasks, "eval_path", None) is not None:
            rank_zero_warn(
                f"RolloutDataModule(val_samples=0): the task source has a separate eval set "
                f"({tasks.eval_path}) that no validation will run; set val_samples > 0 (trajectories per "
                "held-out prompt, TRL's num_generations_eval)"
            )
        if group_size == 1:
            rank_zero_warn(
                "RolloutDataModule(group_size=1): a group of one trajectory has advantage 0 under the "
                "built-in estimators (its reward is its group's mean), so the loss and the gradient are "
                "exactly 0 and nothing trains. Use group_size >= 2."
            )
        self.tasks: TaskSource = tasks  # type: ignore[assignment]
        self.engine_factory: EngineFactory = engine  # type: ignore[assignment]
        self.group_size = group_size
        self.groups_per_step = groups_per_step
        self.seed = seed
        self.steps_per_epoch = steps_per_epoch
        self.val_samples, self.val_tasks, self.val_groups = val_samples, val_tasks, val_groups
        self.val_pass_k = val_pass_k if val_pass_k is not None else max(val_samples, 1)
        self.val_pass_threshold, self.val_seed = val_pass_threshold, val_seed
        self.dynamic_sampling = dynamic_sampling
        self.max_extra_groups = (max_extra_groups or groups_per_step) if dynamic_sampling else 0
        self._engine: RolloutEngine | None = None
        # the run config (W&B, hparams.yaml) gets every data setting under "data", as the YAML names them
        self.save_hyperparameters(
            {
                "data": {
                    "tasks": plain_settings(tasks),
                    "engine": plain_settings(engine),
                    "group_size": group_size,
                    "groups_per_step": groups_per_step,
                    "seed": seed,
                    "steps_per_epoch": steps_per_epoch,
                    "val_samples": val_samples,
                    "val_tasks": val_tasks,
                    "val_groups": val_groups,
                    "val_pass_k": val_pass_k,
                    "val_pass_threshold": val_pass_threshold,
                    "val_seed": val_seed,
                    "dynamic_sampling": dynamic_sampling,
                    "max_extra_groups": max_extra_groups,
                }
            }
        )

    @property
    def engine(self) -> RolloutEngine | None:
        return self._engine

    @override
    def setup(self, stage: str) -> None:
        if self._engine is not None:
            return
        world = self.trainer.world_size if self.trainer is not None else 1
        if self.groups_per_step < world:
            raise ConfigError(
                f"groups_per_step={self.groups_per_step} is smaller than the {world} learner processes; "
                "every rank needs at least one group"
            )
        module = self.trainer.lightning_module if self.trainer is not None else None
        # the engine needs the policy's architecture and a task source that fits (docs/custom.md)
        problems = check_module(module, members=["model_spec"]) + check_tasks(self.tasks)
        problems += check_engine(self.engine_factory)  # what the engine declares: core/contract.py
        if not problems:  # the token ids the tasks use must fit the policy's embedding
            problems = check_vocabulary(module, self.tasks)
        raise_contract_problems(problems, "RolloutDataModule.setup")
        self._engine = self.engine_factory.build(module.model_spec, self.tasks)

    @override
    def train_dataloader(self) -> Any:
        if self._engine is None:
            raise ConfigError("RolloutDataModule.setup('fit') must run before train_dataloader()")
        plan = RolloutBatch(
            self.tasks, self._engine, self.group_size, self.groups_per_step, self.seed, self.max_extra_groups
        )
        return BatchLoader(plan, self.steps_per_epoch)

    @override
    def val_dataloader(self) -> Any:
        if self.val_samples == 0:
            return []  # no batches: Lightning skips the loop
        if self._engine is None:
            raise ConfigError("RolloutDataModule.setup() must run before val_dataloader()")
        held_out = list(self.tasks.validation_tasks())  # type: ignore[attr-defined]
        if self.val_tasks is not None:
            held_out = held_out[: self.val_tasks]
        if not held_out:
            raise ConfigError(f"{type(self.tasks).__name__}.validation_tasks() returned no tasks")
        return ValidationLoader(
            held_out,
            self._engine,
            self.val_samples,
            self.val_groups,
            self.val_seed,
            self.val_pass_k,
            self.val_pass_threshold,
        )

    @override
    def teardown(self, stage: str) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
