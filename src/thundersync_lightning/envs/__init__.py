"""Task families: one package per family (``toy``, ``code``, ``branches``, ``mutations``,
``datasets``, ``swebench``), each with ``source.py`` (its ``TaskSource``) and ``env.py`` (its
``Environment``). Everything else here is the toolkit the families share (``sandbox``, ``tools``,
``repo``: the repository-fixing episode and its trusted grading, and the top-level modules); a
family imports the toolkit, never another family.

The task sources are importable from here (``from thundersync_lightning.envs import DatasetTasks``),
and so is the chat template every family renders with (``ChatRenderer``); each is imported when
first asked for, so using one family loads no other.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the family package (or shared module) that defines it
_SOURCES = {
    "GuessingGameTasks": "toy",
    "LocalCodeTasks": "code",
    "BranchTasks": "branches",
    "MutationTasks": "mutations",
    "DatasetTasks": "datasets",
    "SWEbenchTasks": "swebench",
    "ChatRenderer": "chat",
}

__all__ = list(_SOURCES)


def __getattr__(name: str) -> Any:
    family = _SOURCES.get(name)
    if family is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{family}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_SOURCES])
