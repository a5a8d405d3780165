"""A run's settings as plain data, for the logger's run config (W&B ``config``, ``hparams.yaml``).

Lightning logs ``hparams_initial`` of the module and the data module when a fit starts; objects
(a task source, an engine config) would be logged as their ``repr``. :func:`plain_settings` turns
one into ``{"class_path": ..., "init_args": {...}}`` as a YAML config would write it: a dataclass's
fields, or the ``init_args`` mapping a class keeps of its constructor's arguments (``DatasetTasks``
does), every value made plain (a function becomes ``module:name``, in-memory rows their count).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["plain_settings", "plain_value"]

_MAX_ITEMS = 64  # a longer list (in-memory rows) is logged as its length


def plain_settings(obj: Any) -> dict[str, Any]:
    """``{"class_path": "module.Class", "init_args": {...}}`` of ``obj`` (init_args: a dataclass's
    fields, else ``obj.init_args`` where it is a mapping, else empty)."""
    cls = type(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        args: Mapping[str, Any] = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    else:
        kept = getattr(obj, "init_args", None)
        args = kept if isinstance(kept, Mapping) else {}
    return {
        "class_path": f"{cls.__module__}.{cls.__qualname__}",
        "init_args": {str(k): plain_value(v) for k, v in args.items()},
    }


def plain_value(value: Any) -> Any:
    """``value`` as JSON-like data (see the module docstring)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): plain_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if len(value) > _MAX_ITEMS:
            return f"<{len(value)} items>"
        return [plain_value(v) for v in value]
    if callable(value) and hasattr(value, "__qualname__") and not isinstance(value, type):
        return f"{getattr(value, '__module__', '?')}:{value.__qualname__}"
    if dataclasses.is_dataclass(value) or isinstance(getattr(value, "init_args", None), Mapping):
        return plain_settings(value)
    length = getattr(value, "__len__", None)
    if callable(length):
        try:
            return f"<{type(value).__name__} of {len(value)} rows>"
        except TypeError:
            pass
    return f"<{type(value).__name__}>"
