"""``SplitLocalCodeTasks``: the local repository tasks with a held-out split by task name.

``LocalCodeTasks`` draws every training step from all of its tasks; this subclass holds some out
for validation (``RolloutDataModule(val_samples=...)``): the names in ``val_names``, or else the
tasks whose name hashes below ``val_fraction``. Training steps draw only the others.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..core.errors import ConfigError
from .code.source import LocalCodeTasks, pick
from .code.task import LocalTask

__all__ = ["SplitLocalCodeTasks"]


class SplitLocalCodeTasks(LocalCodeTasks):
    """``LocalCodeTasks`` arguments, plus ``val_names`` (explicit held-out tasks) or ``val_fraction``."""

    def __init__(self, *args: Any, val_names: list[str] | None = None, val_fraction: float = 0.25,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not 0.0 < val_fraction < 1.0:
            raise ConfigError(f"SplitLocalCodeTasks: val_fraction={val_fraction} must be in (0, 1)")
        self.val_names = list(val_names) if val_names is not None else None
        self.val_fraction = val_fraction

    def _held_out(self, task: LocalTask) -> bool:
        if self.val_names is not None:
            return task.name in self.val_names
        h = int.from_bytes(hashlib.blake2b(task.name.encode(), digest_size=8).digest(), "little") % 10_000
        return h < round(self.val_fraction * 10_000)

    def validation_tasks(self) -> list[LocalTask]:
        held = [t for t in self.all_tasks if self._held_out(t)]
        unknown = sorted(set(self.val_names or ()) - {t.name for t in self.all_tasks})
        if unknown or not held or len(held) == len(self.all_tasks):
            raise ConfigError(f"SplitLocalCodeTasks: the split leaves {len(held)} of {len(self.all_tasks)} tasks "
                              f"held out (unknown val_names: {unknown}); both sides need at least one task")
        return held

    def tasks(self, step: int, num_groups: int, seed: int) -> list[LocalTask]:
        train = [t for t in self.all_tasks if not self._held_out(t)]
        return pick(train, step, num_groups, seed)
