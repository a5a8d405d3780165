"""The memory planner: what a configuration needs on each device and host, before anything runs.

Pure arithmetic over the model's shape and the strategy's settings (no Lightning, no devices):
:func:`~.memory_plan.plan_memory` gives a :class:`~.memory_plan.MemoryPlan`, whose ``fits``
names settings that would make it fit (:mod:`.memory_fit`). ``thundersync-lightning plan`` prints
it; the strategy checks it at set-up (``strategy/memory_check.py``).
"""
