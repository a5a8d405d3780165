"""The memory planner: what a configuration needs on each device and host, before anything runs.

Pure arithmetic over the model's shape and the strategy's settings (no Lightning, no devices):
:func:`~.memory_plan.plan_memory` gives a :class:`~.memory_plan.MemoryPlan`, whose ``fits``
names settings that would make it fit (:mod:`.memory_fit`). ``thundersync-lightning plan`` prints
it; the strategy checks it at set-up (``strategy/memory_check.py``).
"""

from .call_tokens import call_padded_tokens
from .memory_fit import HOST_UNCHECKED, Verdict
from .memory_plan import MemoryPlan, PlanInputs, plan_memory
from .model_shape import Architecture, ModelShape
from .sizes import format_bytes, parse_bytes

__all__ = [
    "plan_memory",
    "PlanInputs",
    "MemoryPlan",
    "Verdict",
    "HOST_UNCHECKED",
    "ModelShape",
    "Architecture",
    "call_padded_tokens",
    "format_bytes",
    "parse_bytes",
]
