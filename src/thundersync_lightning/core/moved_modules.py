"""Module paths that moved keep working for one more release, with a DeprecationWarning.

``import thundersync_lightning`` installs :class:`MovedModuleFinder` on ``sys.meta_path``: importing
an old path (in code, or as a YAML ``class_path``) warns once and binds the old name to the new
module itself, so classes, functions and ``isinstance`` checks are the same objects. Where a split
file's parts moved to two modules, the old path answers with the package that re-exports both.
Paths where a package now stands at the old name (``rollout.embedded``, ``rollout.weights``,
``envs.toy``) re-export their public names and need no entry. A name a package stopped
re-exporting (:data:`MOVED_NAMES`) is answered by the package's ``__getattr__`` the same way.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "MOVED_NAMES", "MovedModuleFinder", "install", "moved_name"]

_PACKAGE = "thundersync_lightning"

#: old module path -> new one, both relative to the package (the old paths go in the next release)
MOVED: dict[str, str] = {
    # round one: the planner, the batch types, evaluation and the contract; the split backward
    "strategy.plan": "core.batches",
    "strategy.contract": "core.contract",
    "strategy.evaluation": "core.evaluation",
    "strategy.split_choice": "backends.split.choice",
    "core.call_tokens": "planning.call_tokens",
    "core.memory_fit": "planning.memory_fit",
    "core.memory_plan": "planning.memory_plan",
    "core.model_shape": "planning.model_shape",
    "core.sizes": "planning.sizes",
    "core.split_backward": "backends.split.backward",
    "core.factors": "backends.split.factors",
    "core.row_grads": "backends.split.row_grads",
    # round two: the rooms
    "rollout.vllm_config": "rollout.vllm.config",
    "rollout.vllm_core": "rollout.vllm.core",
    "rollout.vllm_engine": "rollout.vllm.engine",
    "rollout.vllm_loop": "rollout.vllm.loop",
    "rollout.vllm_model": "rollout.vllm.model",
    "rollout.vllm_placement": "rollout.vllm.placement",
    "rollout.vllm_stream": "rollout.vllm.stream",
    "rollout.vllm_teacher": "rollout.vllm.teacher",
    "rollout.vllm_worker": "rollout.vllm.worker",
    "rollout.embedded_process": "rollout.embedded.process",
    "rollout.embedded_worker": "rollout.embedded.worker",
    "rollout.hf_generator": "rollout.embedded.generator",
    "rollout.models": "rollout.hf_model",
    "rollout.agent_loop": "rollout.agent.loop",
    "rollout.env_pool": "rollout.agent.env_pool",
    "rollout.group_gate": "rollout.agent.group_gate",
    "rollout.weight_transport": "rollout.weights.transport",
    "rollout.pool": "rollout.engine_pool",
    "envs.branches.tasks": "envs.branches",
    "envs.swebench_env": "envs.swebench",
    "envs.swebench_log": "envs.swebench.eval_run",
    "core.objective": "core.grpo.objective",
    "core.estimators": "core.grpo.estimators",
    "core.terms": "core.grpo.terms",
    "core.rejection": "core.grpo.rejection",
    "core.dynamic": "core.grpo.group_filter",
    "core.streaming": "core.accumulator.streaming",
    "core.accumulator.queries": "core.accumulator.streaming",
    "core.group": "core.accumulator.group",
    "core.routing": "core.accumulator.routing",
    "core.jobs": "core.accumulator.jobs",
    "core.step_gradient": "core.accumulator.step_gradient",
    "core.bounds": "core.accumulator.bounds",
    "core.report": "core.accumulator.report",
    "core.validation": "core.accumulator.checks",
    "core.prefix": "core.accumulator.boundary_cut",
    "core.storage": "core.gradients.storage",
    "core.copies": "core.gradients.copies",
    "core.deferred": "core.gradients.deferred",
    "core.backward": "core.gradients.backward",
    "core.noise": "core.third_party_noise",
    "callbacks._common": "callbacks.base",
    "strategy.checkpoints": "strategy.strategy",
    "envs.local_split": "envs.code.source",
    "envs.user_code": "core.user_code",
    "envs.code.codec": "envs.codec",
    # round three: envs/code a family like the others; what several families use is the toolkit's
    "envs.code.env": "envs.repo.episode",
    "envs.code.actions": "envs.repo.actions",
    "envs.code.tools": "envs.repo.tools",
    "envs.code.grading": "envs.repo.grading",
    "envs.code.outcomes": "envs.repo.outcomes",
    "envs.code.runner": "envs.repo.runner",
    "envs.code.reporter": "envs.repo.reporter",
    "envs.code.patches": "envs.repo.patches",
    "envs.code.pytest_config": "envs.repo.pytest_config",
}

#: package -> {name it no longer exports: the module that defines it}; the package's ``__getattr__``
#: answers the old name through :func:`moved_name`
MOVED_NAMES: dict[str, dict[str, str]] = {
    "envs.code": {
        **dict.fromkeys(("ByteCodec", "HFTokenizerCodec", "TextCodec"), "envs.codec"),
        **dict.fromkeys(
            ("ACTION_HELP", "Bash", "Invalid", "ReplaceInFile", "Submit", "WriteFile", "parse_action"),
            "envs.repo.actions",
        ),
        **dict.fromkeys(("CodeEnv", "Workspace", "format_observation", "render_prompt"), "envs.repo.episode"),
        **dict.fromkeys(("EvalOutcome", "grade_log"), "envs.repo.grading"),
        **dict.fromkeys(("filter_patch", "split_patch", "patch_paths"), "envs.repo.patches"),
        "is_protected_path": "envs.repo.pytest_config",
    },
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the new module ran when it was imported


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths in :data:`MOVED` and loads the new module under the old name."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        old = fullname.removeprefix(_PACKAGE + ".")
        if old == fullname or old not in MOVED:
            return None
        new = f"{_PACKAGE}.{MOVED[old]}"
        warnings.warn(
            f"{fullname} moved to {new}; the old path is removed in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (idempotent)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


def moved_name(package: str, name: str) -> Any:
    """``package``'s ``__getattr__``: ``name`` from the module that now defines it, with a
    DeprecationWarning, where :data:`MOVED_NAMES` lists it; else the usual AttributeError."""
    new = MOVED_NAMES.get(package.removeprefix(_PACKAGE + "."), {}).get(name)
    if new is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    warnings.warn(
        f"{package}.{name} moved to {_PACKAGE}.{new}.{name}; the old name is removed in the next release",
        DeprecationWarning,
        stacklevel=3,  # the line that asked for the name
    )
    return getattr(importlib.import_module(f"{_PACKAGE}.{new}"), name)
