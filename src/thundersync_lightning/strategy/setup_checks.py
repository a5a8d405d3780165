"""What the strategy checks at set-up, before any engine starts or memory is allocated.

Every problem is collected and reported at once (one :class:`ConfigError`): the Trainer's options
the strategy cannot honour, the module's contract (docs/custom.md), the objective against the
engine, options that need a module method, the data-parallel layout, and the memory plan.
"""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.trainer.states import TrainerFn

from ..core.contract import check_contract
from ..core.errors import ConfigError
from .memory_check import memory_problems
from .objective_checks import check_objective
from .sharding import SHARDINGS

__all__ = ["setup_problems", "check_memory"]

log = logging.getLogger(__name__)


def setup_problems(
    trainer: Any, mode: str, boundary_cut: bool, sharding: str, precision_plugin: Any, world_size: int
) -> list[str]:
    """Everything that makes this fit impossible or silently wrong (empty when it can run)."""
    module = trainer.lightning_module
    problems = []
    if trainer.state.fn == TrainerFn.FITTING and trainer.max_steps == 0:
        problems.append(
            "max_steps=0: this fit would run no step (one Trainer step is one RL batch); give max_steps >= 1 "
            "(--trainer.max_steps)"
        )
    if trainer.accumulate_grad_batches != 1:
        problems.append(
            f"accumulate_grad_batches={trainer.accumulate_grad_batches}: with strategy='thundersync' one "
            "Trainer step is one RL batch; raise the data module's groups_per_step instead"
        )
    problems += check_contract(module, trainer.datamodule, mode)  # docs/custom.md
    if callable(getattr(module, "score_tokens", None)):
        problems += check_objective(module, getattr(trainer, "datamodule", None))
    if boundary_cut and not callable(getattr(module, "encode_prefix", None)):
        problems.append(
            f"boundary_cut=True needs {type(module).__name__}.encode_prefix(tokens) (and score_tokens(..., "
            "prefix=)); GRPOPolicy has both"
        )
    problems += SHARDINGS[sharding].problems(world_size)
    if not module.automatic_optimization:
        problems.append("strategy='thundersync' drives the optimizer itself: use automatic optimization")
    if isinstance(precision_plugin, MixedPrecision) and precision_plugin.scaler is not None:
        problems.append(
            "precision='16-mixed' scales the loss for its GradScaler, which streamed gradients bypass; "
            "use precision='bf16-mixed', 'bf16-true' or '32-true'"
        )
    return problems


def check_memory(trainer: Any, strategy: Any, memory_check: str) -> None:
    """The learner's memory plan against this machine (docs/scaling.md), before anything allocates:
    ``error`` refuses a plan that certainly does not fit, ``warn`` logs it, ``off`` skips it."""
    if memory_check == "off":
        return
    problems, certain = memory_problems(trainer, strategy)
    if problems and certain and memory_check == "error":
        raise ConfigError(problems[0])
    for problem in problems:
        log.warning("memory_check=%r: %s", memory_check, problem)
