"""Byte sizes as people write them (``80GB``, ``80GiB``, ``512MiB``) and as the planner prints them.

Decimal units are powers of 10 (``GB`` = 10^9), binary ones powers of 2 (``GiB`` = 2^30), as
``nvidia-smi`` and ``free`` mean them; a size is a whole, non-negative number of bytes.
"""

from __future__ import annotations

import math

from ..core.errors import ConfigError

__all__ = ["parse_bytes", "format_bytes"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip
_EXAMPLES = "write e.g. 80GB, 80GiB, 512MiB or a byte count"


def parse_bytes(text: str | int) -> int:
    """``"80GB"`` (10^9), ``"80GiB"`` (2^30), ``"512MiB"``, ``"1.5TB"`` or a plain byte count."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ConfigError(f"cannot read {text!r} as a size: {_EXAMPLES}")
    if isinstance(text, int):
        value: float = text
    else:
        s = text.strip().lower().replace(" ", "")
        number = s.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = s[len(number) :]
        try:
            value = float(number) * _UNITS[unit]
        except (KeyError, ValueError):
            raise ConfigError(f"cannot read {text!r} as a size: {_EXAMPLES}") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"a size must be a finite number of bytes >= 0, got {text!r}")
    return int(value)


def format_bytes(n: float) -> str:
    """Bytes in GiB/MiB/KiB with three significant digits (``0`` for nothing)."""
    if n == 0:
        return "0"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"
