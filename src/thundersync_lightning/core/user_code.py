"""Import a user's ``module:attr`` from YAML, or say in a few lines why not and how to fix it."""

from __future__ import annotations

import importlib
from typing import Any

from .errors import ConfigError

__all__ = ["import_object"]


def import_object(path: str, what: str) -> Any:
    """``module:attr`` imported; a ConfigError naming ``what`` (e.g. "tool", "reward function"),
    the module, the error and the fix (``PYTHONPATH`` for a file of the user's, ``pip install``
    for a package the module needs)."""
    module, colon, attr = path.partition(":")
    if not colon or not module or not attr:
        raise ConfigError(f"{what} {path!r}: write it as 'module:callable' (e.g. 'my_tools:calculator')")
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and module != missing and not module.startswith(missing + "."):
            fix = f"it imports {missing!r}, which is not installed: pip install {missing.split('.')[0]}"
        else:
            fix = (
                f"a file ./{module.replace('.', '/')}.py needs PYTHONPATH=. (or the directory that holds it; "
                "the engine's process imports it too), a package must be installed (pip install -e .)"
            )
        raise ConfigError(
            f"{what} {path!r}: module {module!r} cannot be imported ({exc}).\n  Fix: {fix}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing
        raise ConfigError(
            f"{what} {path!r}: importing module {module!r} raised {type(exc).__name__}: {exc}"
        ) from None
    if not hasattr(imported, attr):
        public = sorted(n for n, v in vars(imported).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(
            f"{what} {path!r}: module {module!r} ({getattr(imported, '__file__', '?')}) has no {attr!r}; "
            f"its callables: {', '.join(public) or 'none'}"
        )
    return getattr(imported, attr)
