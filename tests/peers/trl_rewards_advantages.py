"""TRL 1.16's own rewards and advantages for given completions, written as JSON (run in a TRL venv).

    .venv-trl/bin/python tests/peers/trl_rewards_advantages.py IN.json OUT.json

Runs in a separate environment with ``trl`` installed (the project's venv has no TRL): it never
imports thundersync_lightning. The rewards come from ``GRPOTrainer._calculate_rewards`` called on a
minimal stand-in for the trainer (the attributes that method reads); the advantages from the lines
of ``GRPOTrainer._generate_and_score_completions`` between ``unscorable_mask = ...`` and
``advantages = torch.nan_to_num(...)``, taken from TRL's installed source and executed as they are
(a TRL whose method no longer holds those lines fails here, loudly).

IN.json::

    {"reward_funcs": ["module:function", ...],        # imported as TRL users pass them
     "reward_weights": [1.0, ...] | null,              # TRL's GRPOConfig.reward_weights
     "num_generations": G, "scale_rewards": "group",   # GRPOConfig names
     "multi_objective_aggregation": "sum_then_normalize",
     "inputs": [{column: value, ...}, ...],            # one dataset row per completion (B*G, group-major)
     "prompts": [...], "completions": [...], "completion_ids": [[...], ...]}

OUT.json: ``rewards_per_func`` (B*G x F, null for TRL's NaN: a reward that returned None),
``rewards`` (the weighted nansum, null where unscorable), ``unscorable`` (bools), ``advantages``
(TRL's, 0 for unscorable), ``trl_version``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import math
import sys
import textwrap
import threading
from types import SimpleNamespace
from typing import Any

START = "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)"
END = "advantages = torch.nan_to_num(advantages, nan=0.0)"


def _import(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _advantage_block(trainer_cls: type) -> str:
    """The advantage lines of TRL's ``_generate_and_score_completions``, dedented."""
    source = inspect.getsource(trainer_cls._generate_and_score_completions)
    start, end = source.index(START), source.index(END)
    start = source.rindex("\n", 0, start) + 1
    end = source.index("\n", end)
    return textwrap.dedent(source[start:end])


def _event_loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return loop


def compute(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from accelerate import PartialState
    from trl import __version__ as trl_version
    from trl.trainer import grpo_trainer
    from trl.trainer.grpo_trainer import GRPOTrainer

    PartialState()  # accelerate's gather() reads the (single-process) state
    funcs = [_import(p) for p in spec["reward_funcs"]]
    weights = spec.get("reward_weights") or [1.0] * len(funcs)
    device = torch.device("cpu")
    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(device=device, process_index=0, is_main_process=True),
        args=SimpleNamespace(report_to=[]),  # profiling_context reads it: no reporting
        reward_funcs=funcs,
        reward_processing_classes=[None] * len(funcs),
        reward_func_names=[f.__name__ for f in funcs],
        state=SimpleNamespace(global_step=0),
        _log_completion_extra=lambda *a, **k: None,
        _log_metric=lambda *a, **k: None,
        environments=None,
        async_loop=_event_loop(),
        reward_weights=torch.tensor(weights, dtype=torch.float32),
        multi_objective_aggregation=spec.get("multi_objective_aggregation", "sum_then_normalize"),
        scale_rewards=spec.get("scale_rewards", "group"),
    )
    trainer._metrics = {"train": {}}
    rewards_per_func = GRPOTrainer._calculate_rewards(
        trainer, spec["inputs"], spec["prompts"], spec["completions"], spec["completion_ids"]
    )
    scope = {
        **vars(grpo_trainer),
        "self": trainer,
        "device": device,
        "rewards_per_func": rewards_per_func,
        "num_generations": int(spec["num_generations"]),
        "torch": torch,
    }
    exec(_advantage_block(GRPOTrainer) + "\n" + END, scope)  # noqa: S102 - TRL's own lines, from its installed source

    def plain(t: Any) -> Any:
        return [None if isinstance(x, float) and math.isnan(x) else x for x in t.tolist()]

    return {
        "trl_version": trl_version,
        "rewards_per_func": [plain(row) for row in rewards_per_func],
        "rewards": plain(scope["rewards"]),
        "unscorable": scope["unscorable_mask"].tolist(),
        "advantages": plain(scope["advantages"]),
    }


if __name__ == "__main__":
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        result = compute(json.load(f))
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
