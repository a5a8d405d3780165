"""Unknown options are errors: a misspelt keyword must never run as if it were not given.

Python rejects an unknown keyword with a bare ``TypeError`` (and a class that forwards
``**kwargs`` to a parent may accept it silently). Configuration objects built from YAML or the
command line use :func:`strict_options` instead, so the error is a
:class:`~thundersync_lightning.core.errors.ConfigError` that names the option, lists the valid
ones and suggests the closest::

    @strict_options
    @dataclass(frozen=True, slots=True)
    class EngineConfig:
        temperature: float = 1.0

    EngineConfig(temprature=0.7)
    # ConfigError: EngineConfig got an unknown option 'temprature' (did you mean 'temperature'?) ...

An option that is known but has no effect in the chosen mode (a distribution parameter of a
distribution not selected) is the same trap; :func:`inapplicable` lists those set away from
their default, for the config's own validation to report.

A TRL ``GRPOConfig`` / ``GRPOTrainer`` name used where it means nothing here (``num_generations``,
``beta``, ``peft_config``, ...) is answered with its counterpart (:data:`TRL_NAMES`, the table of
docs/trl.md) instead of a "did you mean"::

    RolloutDataModule(num_generations=8)
    # ConfigError: RolloutDataModule got unknown option 'num_generations' (TRL's GRPOConfig name;
    # here: data.group_size, trajectories per prompt) ...

Invariant: the decorated constructor's signature is unchanged (``inspect.signature`` follows
``__wrapped__``), so jsonargparse/LightningCLI still read the typed parameters; every call with
known keywords behaves exactly as before.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .errors import ConfigError

__all__ = ["reject_unknown", "strict_options", "inapplicable", "TRL_NAMES", "trl_hint"]

T = TypeVar("T")

_TASKS = "data.tasks (DatasetTasks)"
#: TRL 1.16's GRPOConfig / GRPOTrainer names -> where the setting lives here (docs/trl.md's table).
TRL_NAMES: dict[str, str] = {
    "num_generations": "data.group_size, trajectories per prompt",
    "num_generations_eval": "data.val_samples, trajectories per held-out prompt",
    "per_device_train_batch_size": "data.groups_per_step, groups of group_size trajectories per optimizer "
    "step over all ranks",
    "generation_batch_size": "data.groups_per_step, groups per optimizer step over all ranks",
    "steps_per_generation": "none: every step's rollouts come from that step's weights (zero staleness); "
    "data.groups_per_step sets the step's size",
    "gradient_accumulation_steps": "none: a step's trajectories are accumulated as they stream in; "
    "data.groups_per_step sets the step's size",
    "num_iterations": "none: one optimizer step per batch of rollouts (on-policy, the ratio is 1)",
    "epsilon": "none: one optimizer step per batch of rollouts, the ratio is 1 and no clip applies",
    "epsilon_high": "none: one optimizer step per batch of rollouts, the ratio is 1 and no clip applies",
    "max_completion_length": f"{_TASKS}.max_action_tokens, a limit per turn (with max_turns turns)",
    "max_tool_calling_iterations": f"{_TASKS}.max_turns, which is max_tool_calling_iterations + 1",
    "chat_template_kwargs": f"{_TASKS}.template_kwargs",
    "train_dataset": f"{_TASKS}.path",
    "eval_dataset": f"{_TASKS}.eval_dataset (Python) or val_path (YAML), with data.val_samples > 0",
    "reward_funcs": f"{_TASKS}.reward",
    "reward_weights": f"{_TASKS}.reward_weights",
    "environment_factory": f"{_TASKS}.environment_factory (Python) or environment (YAML)",
    "processing_class": f"{_TASKS}.tokenizer_path and model.pretrained_path",
    "peft_config": "model.lora, LoraSettings(r, alpha, dropout, target_modules)",
    "learning_rate": "model.lr",
    "beta": "model.objective.kl_coef (the 'trl' preset's kl_estimator k3_corrected is TRL's)",
    "loss_type": "model.objective.loss_agg (dapo: token-mean, grpo: seq-mean-token-mean, dr_grpo: "
    "seq-mean-token-sum-norm; docs/objective.md)",
    "scale_rewards": "model.objective.scale (group, batch or none)",
    "mask_truncated_completions": "model.objective.overlong_filter",
    "vllm_importance_sampling_correction": "model.objective.is_correction",
    "use_vllm": "data.engine: thundersync_lightning.rollout.VLLMEngineConfig",
    "report_to": "trainer.logger (thundersync_lightning.callbacks.ThunderSyncWandbLogger for W&B)",
    "log_completions": (
        "trainer.callbacks: thundersync_lightning.callbacks.TrajectoryLogger (trajectories.jsonl)"
    ),
    "num_train_epochs": "trainer.max_steps (reinforcement learning has no epochs)",
    "logging_steps": "trainer.log_every_n_steps",
    "output_dir": "trainer.default_root_dir",
}


def trl_hint(name: str) -> str:
    """`` (TRL's GRPOConfig name; here: ...)`` for a TRL name (the last dotted part), or nothing."""
    counterpart = TRL_NAMES.get(name.rpartition(".")[2].lstrip("-"))
    return f" (TRL's GRPOConfig name; here: {counterpart})" if counterpart else ""


def reject_unknown(owner: str, given: Iterable[str], valid: Iterable[str]) -> None:
    """Raise :class:`ConfigError` naming every name of ``given`` that is not in ``valid``."""
    valid_names = sorted(set(valid))
    unknown = sorted(set(given) - set(valid_names))
    if not unknown:
        return
    lines = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid_names, n=1)
        hint = trl_hint(name) or (f" (did you mean {close[0]!r}?)" if close else "")
        lines.append(f"{name!r}{hint}")
    noun = "option" if len(unknown) == 1 else "options"
    raise ConfigError(
        f"{owner} got unknown {noun} {', '.join(lines)}; an unknown option would otherwise be ignored "
        f"silently. Valid options: {', '.join(valid_names)}."
    )


def _keyword_names(fn: Callable[..., Any]) -> tuple[frozenset[str], bool]:
    """Names ``fn`` accepts by keyword, and whether it takes ``**kwargs``."""
    params = inspect.signature(fn).parameters.values()
    names = frozenset(
        p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
    )
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


def strict_options(cls: type[T]) -> type[T]:
    """Class decorator: unknown keyword arguments of the constructor raise :class:`ConfigError`.

    Apply it above ``@dataclass`` (it wraps the generated ``__init__``) or to any class whose
    ``__init__`` lists its options explicitly (no ``**kwargs``).
    """
    init = cls.__init__
    valid, var_keyword = _keyword_names(init)
    if var_keyword:
        raise TypeError(f"strict_options cannot check {cls.__name__}: its __init__ takes **kwargs")
    owner = cls.__name__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        reject_unknown(owner, kwargs, valid)
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]
    return cls


def inapplicable(config: Any, names: Iterable[str], because: str) -> list[str]:
    """Problems for the dataclass fields ``names`` of ``config`` set away from their default.

    ``because`` completes "has no effect ...", e.g. ``"with source='trace'"``.
    """
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        for f in dataclasses.fields(config)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    return [
        f"{name}={getattr(config, name)!r} has no effect {because}"
        for name in names
        if name in defaults and getattr(config, name) != defaults[name]
    ]
