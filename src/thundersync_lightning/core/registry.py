"""One registry helper for every extension point registered by name (estimators, rewards, tool parsers).

Every registry behaves alike:

- registration is a call, ``register(name, fn)``, or a decorator, ``@register(name)``;
- a name taken by another function is a :class:`ConfigError` unless ``overwrite=True``
  (registering the same function again changes nothing: a module imported twice);
- an unknown name is a :class:`ConfigError` naming the valid names, with a did-you-mean.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Generic, TypeVar, overload

from .errors import ConfigError

__all__ = ["Registry"]

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions by name. ``kind`` names the entries in messages ("advantage estimator"); ``hint``
    says how to add one (ends the unknown-name message)."""

    def __init__(self, kind: str, hint: str = "", normalize: Callable[[str], str] = str) -> None:
        self.kind = kind
        self.hint = hint
        self._normalize = normalize
        self._entries: dict[str, F] = {}

    @overload
    def register(self, name: str, fn: None = None, *, overwrite: bool = False) -> Callable[[F], F]: ...

    @overload
    def register(self, name: str, fn: F, *, overwrite: bool = False) -> F: ...

    def register(self, name: str, fn: F | None = None, *, overwrite: bool = False) -> F | Callable[[F], F]:
        """Register ``fn`` as ``name`` (without ``fn``: a decorator doing it)."""
        if fn is None:
            return lambda f: self.register(name, f, overwrite=overwrite)
        key = self._normalize(name)
        taken = self._entries.get(key)
        if taken is not None and taken is not fn and not overwrite:
            raise ConfigError(
                f"{self.kind} {key!r} is already registered; pass overwrite=True to replace it "
                f"(registered: {getattr(taken, '__qualname__', taken)!s})"
            )
        self._entries[key] = fn
        return fn

    def get(self, name: str) -> F:
        key = self._normalize(name)
        try:
            return self._entries[key]
        except KeyError:
            raise ConfigError(self.unknown(name)) from None

    def unknown(self, name: str) -> str:
        """The message for an unknown ``name``: the valid names, a did-you-mean and the hint."""
        names = self.names()
        close = difflib.get_close_matches(self._normalize(name), names, n=1)
        did = f" (did you mean {close[0]!r}?)" if close else ""
        hint = f"; {self.hint}" if self.hint else ""
        return f"unknown {self.kind} {name!r}; valid names: {', '.join(names)}{did}{hint}"

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._normalize(name) in self._entries
