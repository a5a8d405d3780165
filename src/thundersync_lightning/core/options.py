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

__all__ = ["reject_unknown", "strict_options", "inapplicable"]

T = TypeVar("T")


def reject_unknown(owner: str, given: Iterable[str], valid: Iterable[str]) -> None:
    """Raise :class:`ConfigError` naming every name of ``given`` that is not in ``valid``."""
    valid_names = sorted(set(valid))
    unknown = sorted(set(given) - set(valid_names))
    if not unknown:
        return
    lines = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid_names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
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
