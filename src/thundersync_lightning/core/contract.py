"""The extension contract: what a LightningModule and a task source must provide, checked up front.

A custom policy or task fails at set-up with one :class:`ConfigError` that lists every missing or
malformed member, instead of one ``AttributeError`` per run in the middle of a step (or inside the
engine's process). The required members are listed once, here (:data:`MODULE_CONTRACT`,
:data:`TASK_SOURCE_CONTRACT`, :data:`ENVIRONMENT_CONTRACT`, :data:`ENGINE_CONTRACT`); docs/custom.md
explains them.

The checks are duck-typed (no ``isinstance`` against our classes): any object with the members
passes. A member ``kind`` is ``"method"`` (callable, with at least ``arity`` positional
parameters), ``"attribute"`` (present) or a type (an instance of it, ``None`` allowed where
``optional``).
"""

from __future__ import annotations

import inspect
import os
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .protocols import EngineFootprint, EngineSampling
from .types import ModelSpec

__all__ = [
    "Member",
    "MODULE_CONTRACT",
    "TASK_SOURCE_CONTRACT",
    "ENVIRONMENT_CONTRACT",
    "ENGINE_CONTRACT",
    "check_module",
    "check_tasks",
    "check_environment",
    "check_engine",
    "check_contract",
    "check_vocabulary",
    "policy_vocabulary",
    "task_vocabulary",
    "pretrained_path_problem",
    "raise_contract_problems",
]

ALL_MODES: tuple[str, ...] = ("streaming", "sync", "async")


@dataclass(frozen=True, slots=True)
class Member:
    """One required member: its name, what it must be, and what it is for (shown in the error)."""

    name: str
    kind: str | type  # "method", "attribute", or a type the value must be an instance of
    purpose: str
    arity: int = 0  # methods: positional parameters it must accept
    optional: bool = False  # typed members: None is allowed
    modes: tuple[str, ...] = ALL_MODES  # strategy modes that need it


#: What ``strategy="thundersync"`` and ``RolloutDataModule`` use of the LightningModule.
MODULE_CONTRACT: tuple[Member, ...] = (
    Member(
        "score_tokens",
        "method",
        "score_tokens(trajectories, *, entropy=False, reference=False) -> TokenScores: per-token logprobs "
        "with a graph (every mode trains the module's `objective` from them)",
        1,
    ),
    Member("model_spec", ModelSpec, "model_spec: a ModelSpec the engine builds its copy of the policy from"),
    Member("weights_for_engine", "method", "weights_for_engine() -> {Hugging Face name: tensor} to publish"),
)

#: What the data module and the engines use of the task source.
TASK_SOURCE_CONTRACT: tuple[Member, ...] = (
    Member("tasks", "method", "tasks(step, num_groups, seed) -> one task per group", 3),
    Member("make_env", "method", "make_env(task, seed) -> an Environment (reset, step, verdict, close)", 2),
    Member("max_turns", int, "max_turns: int >= 1, agent turns per episode"),
    Member("max_action_tokens", int, "max_action_tokens: int >= 1, tokens per action"),
    Member("stop_token", int, "stop_token: int or None, the token that ends an action", optional=True),
)

#: What the engines call on an environment (built by ``make_env``).
ENVIRONMENT_CONTRACT: tuple[Member, ...] = (
    Member("reset", "method", "reset() -> the prompt's token ids"),
    Member("step", "method", "step(action_ids) -> StepResult(observation, done)", 1),
    Member("verdict", "method", "verdict() -> float, the reward"),
    Member("close", "method", "close() -> None"),
)

#: What the data module, the strategy's set-up checks and the memory plan use of an engine config.
ENGINE_CONTRACT: tuple[Member, ...] = (
    Member("build", "method", "build(model_spec, tasks) -> a RolloutEngine (publish, rollout, shutdown)", 2),
    Member(
        "sampling",
        EngineSampling,
        "sampling: an EngineSampling (temperature, top_p, top_k, logprobs, "
        "teacher), what the learner must score",
    ),
    Member(
        "footprint",
        EngineFootprint,
        "footprint: an EngineFootprint (context limit, memory on the learner's GPU, weight-sync buckets) "
        "for the memory plan",
    ),
)


def _accepts(fn: Any, arity: int) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: give them the benefit
        return True
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    return len(positional) >= arity >= len(required)


def _check(obj: Any, members: Sequence[Member], owner: str, static: bool = False) -> list[str]:
    """Problems of ``obj`` against ``members``; ``static``: ``obj`` is a class (attributes not checked)."""
    problems = []
    for m in members:
        if static and m.kind != "method":
            continue
        try:
            value = getattr(obj, m.name)
        except AttributeError:
            problems.append(f"{owner} has no `{m.name}`: needs {m.purpose}")
            continue
        except Exception as err:  # noqa: BLE001 - a property that fails is a problem to report
            problems.append(f"{owner}.{m.name} raised {type(err).__name__}: {err}")
            continue
        if m.kind == "method":
            if not callable(value):
                problems.append(f"{owner}.{m.name} is not callable: needs {m.purpose}")
            elif not static and not _accepts(value, m.arity):  # a class's functions also take self
                problems.append(
                    f"{owner}.{m.name}{_signature(value)} does not take {m.arity} argument(s): {m.purpose}"
                )
        elif isinstance(m.kind, type):
            if value is None and m.optional:
                continue
            if not isinstance(value, m.kind) or (m.kind is int and isinstance(value, bool)):
                problems.append(f"{owner}.{m.name} is {value!r} ({type(value).__name__}): needs {m.purpose}")
            elif m.kind is int and value < 1 and not m.optional:
                problems.append(f"{owner}.{m.name} is {value}: needs {m.purpose}")
    return problems


def _signature(fn: Any) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def check_module(module: Any, mode: str | None = None, members: Sequence[str] | None = None) -> list[str]:
    """Problems of a LightningModule against :data:`MODULE_CONTRACT` (empty: it fits).

    Args:
        mode: the strategy mode (members needed only by other modes are skipped); ``None``: all.
        members: check only these names (e.g. ``["model_spec"]`` for the data module alone).
    """
    wanted = [
        m
        for m in MODULE_CONTRACT
        if (mode is None or mode in m.modes) and (members is None or m.name in members)
    ]
    return _check(module, wanted, type(module).__name__)


def check_environment(env: Any, owner: str | None = None) -> list[str]:
    """Problems of an environment (an instance or a class) against :data:`ENVIRONMENT_CONTRACT`."""
    name = owner or (env.__name__ if isinstance(env, type) else type(env).__name__)
    return _check(env, ENVIRONMENT_CONTRACT, name, static=isinstance(env, type))


def check_engine(engine: Any) -> list[str]:
    """Problems of an engine config against :data:`ENGINE_CONTRACT` (empty: it fits)."""
    return _check(engine, ENGINE_CONTRACT, type(engine).__name__)


def check_tasks(tasks: Any, build_env: bool = True) -> list[str]:
    """Problems of a task source against :data:`TASK_SOURCE_CONTRACT` and of its environments.

    The environment is checked through ``make_env``'s return annotation where it names a class;
    otherwise (``build_env``) one environment is built for the first task of step 0 and closed.
    """
    owner = type(tasks).__name__
    problems = _check(tasks, TASK_SOURCE_CONTRACT, owner)
    make_env = getattr(tasks, "make_env", None)
    if not callable(make_env):
        return problems
    env_class = _return_class(make_env)
    if env_class is not None:
        return problems + check_environment(env_class, f"{owner}.make_env's {env_class.__name__}")
    if not build_env:
        return problems
    try:
        task = list(tasks.tasks(0, 1, 0))[0]
        env = make_env(task, 0)
    except Exception as err:  # noqa: BLE001 - reported with the other problems
        return [*problems, f"{owner}: building an environment for step 0 failed: {type(err).__name__}: {err}"]
    try:
        return problems + check_environment(env, f"{owner}.make_env's {type(env).__name__}")
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


def _return_class(fn: Any) -> type | None:
    try:
        hint = typing.get_type_hints(fn).get("return")
    except Exception:  # noqa: BLE001 - unresolvable annotations: fall back to building one
        return None
    return hint if isinstance(hint, type) and hint is not type(None) else None


def check_contract(module: Any, datamodule: Any = None, mode: str | None = None) -> list[str]:
    """Every problem of the module and, where the data module has them, of its task source and its
    engine config (``engine_factory``)."""
    problems = check_module(module, mode)
    engine = getattr(datamodule, "engine_factory", None)
    if engine is not None:
        problems += check_engine(engine)
    tasks = getattr(datamodule, "tasks", None)
    if tasks is not None:
        problems += check_tasks(tasks)
        if not problems:  # before any engine or logger starts
            problems += check_vocabulary(module, tasks)
    return problems


def policy_vocabulary(module: Any) -> int | None:
    """Token ids the policy can embed: its ``vocab_size`` (the input embedding's rows), else its
    ``model_spec.config["vocab_size"]`` for a model built from a config; ``None``: unknown."""
    size = getattr(module, "vocab_size", None)
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    spec = getattr(module, "model_spec", None)
    if isinstance(spec, ModelSpec) and spec.pretrained_path is None:
        size = (spec.config or {}).get("vocab_size")
        return int(size) if isinstance(size, int) else None
    return None


def task_vocabulary(tasks: Any) -> tuple[int, str] | None:
    """Token ids a task source's prompts, observations and stop token use (``vocab_size``, or its
    ``codec.vocab_size``) and where that number comes from; ``None``: the source does not say."""
    for owner, where in ((tasks, type(tasks).__name__), (getattr(tasks, "codec", None), "its codec")):
        size = getattr(owner, "vocab_size", None) if owner is not None else None
        if isinstance(size, int) and not isinstance(size, bool):
            return size, f"{where} ({type(owner).__name__}.vocab_size)" if owner is not tasks else where
    return None


def check_vocabulary(module: Any, tasks: Any) -> list[str]:
    """The task source's token ids must fit the policy's embedding: an id past it fails inside the
    engine's generation (an index error in the embedding) long after set-up."""
    policy, source = policy_vocabulary(module), task_vocabulary(tasks)
    if policy is None or source is None or source[0] <= policy:
        return []
    needed, where = source
    return [
        f"the policy embeds {policy} token ids (vocab_size {policy}) but {type(tasks).__name__} uses ids up "
        f"to {needed - 1} (vocab_size {needed}, from {where}): set the model's vocab_size to at least "
        f"{needed} (model.config.vocab_size in a config), or give the task source the model's own tokenizer "
        "(tokenizer_path)"
    ]


def pretrained_path_problem(path: str | None) -> str | None:
    """Why ``path`` is not a local Hugging Face model directory (``None``: it is one, or no path)."""
    if path is None:
        return None
    where = path if os.path.isabs(path) else f"{path} (from {os.getcwd()})"
    if not os.path.exists(path):
        return (
            f"pretrained_path {where!r} does not exist: give a local model directory (config.json and "
            "weights, e.g. written by save_pretrained or huggingface-cli download "
            "--local-dir); nothing is downloaded"
        )
    if not os.path.isdir(path):
        return (
            f"pretrained_path {where!r} is a file: give the model's directory (the one holding config.json)"
        )
    if not os.path.isfile(os.path.join(path, "config.json")):
        return (
            f"pretrained_path {where!r} has no config.json: give the model's directory, "
            "not a parent or a subfolder"
        )
    return None


def raise_contract_problems(problems: Sequence[str], where: str) -> None:
    """One :class:`ConfigError` listing every problem (nothing when there is none)."""
    if problems:
        raise ConfigError(
            f"{where}: the module, task source or engine does not fit the extension contract "
            "(docs/custom.md):\n  - " + "\n  - ".join(problems)
        )
