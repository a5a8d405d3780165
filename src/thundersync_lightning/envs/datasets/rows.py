"""The rows of a dataset, from a file or from memory, with bad data named where it is.

Accepted: a JSONL file (one object per line), a JSON file (a list of objects), a parquet file, a
``Dataset.save_to_disk`` directory, an in-memory ``datasets.Dataset`` (or ``DatasetDict`` with
``split``) and a list of dicts. JSON files are read line by line here, so a line that is not a
JSON object is a ConfigError naming the file and the line (not a parser's traceback), and a file
without rows says so. Rows stay Python values: a conversational ``prompt`` (a list of
``{"role", "content"}`` messages, TRL's format) is kept as it is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.errors import ConfigError
from .conventions import RewardError

__all__ = ["Rows", "read_rows", "DatasetRowError"]


class DatasetRowError(RewardError, ValueError):
    """A row cannot be an episode (a null mapped field, a malformed prompt): its trajectories fail
    at reset and count as reward errors (``rollout/reward_error_fraction``, ``summary.json``)."""


@dataclass(frozen=True, slots=True)
class Rows:
    """Rows as dicts, their columns (in first-seen order) and what they came from (for messages)."""

    rows: tuple[dict[str, Any], ...]
    columns: tuple[str, ...]
    origin: str


def _columns(rows: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for r in rows:
        seen.update(dict.fromkeys(r))
    return tuple(seen)


def _jsonl(path: str) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ConfigError(
                    f"{path}:{number}: not valid JSON ({exc}): {line.strip()[:120]!r}"
                ) from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}:{number}: a row must be a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _json(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text) if text.strip() else []
    except ValueError as exc:
        if "\n" in text.strip() and text.lstrip().startswith("{"):
            return _jsonl(path)  # JSON Lines under a .json name
        line = getattr(exc, "lineno", "?")
        raise ConfigError(f"{path}:{line}: not valid JSON ({exc})") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ConfigError(f"{path}: expected a list of JSON objects (or JSON Lines)")
    return data


def read_rows(source: Any, split: str = "train") -> Rows:
    """The rows of ``source`` (see the module docstring); a ConfigError for a missing, unreadable or
    empty source."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise ConfigError(f"DatasetTasks: {path!r} does not exist")
        ext = os.path.splitext(path)[1]
        if os.path.isdir(path) or ext == ".parquet":
            rows = _arrow(path, split)
        elif ext in (".jsonl", ".json"):
            rows = _jsonl(path) if ext == ".jsonl" else _json(path)
        else:
            raise ConfigError(
                f"DatasetTasks: {path!r}: use .jsonl, .json, .parquet or a save_to_disk directory"
            )
        origin = path
    elif isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        if not all(isinstance(r, Mapping) for r in source):
            raise ConfigError("DatasetTasks: an in-memory list of rows must hold mappings (one dict per row)")
        rows, origin = [dict(r) for r in source], "the given rows"
    else:
        rows, origin = _in_memory(source, split), f"the given {type(source).__name__}"
    if not rows:
        raise ConfigError(f"DatasetTasks: {origin} has no rows")
    return Rows(tuple(rows), _columns(rows), origin)


def _arrow(path: str, split: str) -> list[dict[str, Any]]:
    import datasets

    if os.path.isdir(path):
        data = datasets.load_from_disk(path)
    else:
        data = datasets.load_dataset("parquet", data_files=path, split="train")
    return _in_memory(data, split, path)


def _in_memory(data: Any, split: str, origin: str | None = None) -> list[dict[str, Any]]:
    import datasets

    where = origin or f"the given {type(data).__name__}"
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise ConfigError(f"DatasetTasks: {where} has splits {list(data)}, not {split!r}")
        data = data[split]
    if not isinstance(data, datasets.Dataset):
        raise ConfigError(
            f"DatasetTasks: data must be a file path, a datasets.Dataset or a list of dicts, "
            f"got {type(data).__name__}"
        )
    return [dict(r) for r in data]
