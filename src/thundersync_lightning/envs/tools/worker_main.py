"""The child side of :mod:`.workers`: run Python tool functions sent over stdin, one at a time.

Run as a script (``python worker_main.py``), never imported by the package: it needs only the
standard library and the user's own module, so a worker starts in the time of a bare interpreter.

Protocol (frames are a 4-byte big-endian length and a payload): the parent sends one pickled
``("module:function", arguments, max_chars, positional, sys_path)`` per call (its ``sys.path``
now: entries the worker lacks are put first). The child answers each in JSON, never pickle (the
parent must not unpickle what user code running on the model's arguments could have written):
``["ok", text]`` or ``["error", "ExceptionType: message"]``, text cut to ``max_chars``. With
``max_chars`` None the call is a reward's: ``["ok", value]`` with the function's value as plain
JSON data (numbers, None, strings, lists, string-keyed dicts; the caller checks its shape), or
``["value", why]`` when it is none of those. A coroutine function's value is awaited.
The protocol runs on a copy of the original stdout; the tool's own prints go to stderr, which the
parent discards (what a function prints is not the engine's log). The worker may run confined
(:mod:`.confine`): it needs nothing but the interpreter, the standard library and the user's module.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import inspect
import json
import numbers
import os
import pickle
import signal
import struct
import sys
from typing import Any, BinaryIO


def _read(stream: BinaryIO) -> Any:
    head = stream.read(4)
    if len(head) < 4:
        return None  # the parent closed the pipe (or died): stop
    (size,) = struct.unpack(">I", head)
    return pickle.loads(stream.read(size))


def _write(stream: BinaryIO, obj: Any) -> None:
    data = json.dumps(obj).encode()
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def tool_text(value: Any) -> str:
    """A tool's value as the model reads it (the in-thread host of an environment class writes it so too)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON data (numpy scalars and tuples included); TypeError when it is not such data."""
    if depth > 8:
        raise TypeError("nested deeper than 8 levels")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, depth + 1) for k, v in value.items()}
    raise TypeError(f"{type(value).__name__} is not plain data")


def main() -> None:
    try:  # die with the parent (Linux): a hung tool must not outlive the run
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the tool's prints must not corrupt the protocol
    inp = sys.stdin.buffer
    functions: dict[str, Any] = {}
    while True:
        message = _read(inp)
        if message is None:
            return
        path, arguments, max_chars, positional, paths = message
        # the caller's sys.path now: a directory it added after this worker started (a user's
        # module, imported by a later task source) must be found too
        sys.path[:0] = [p for p in paths if p not in sys.path]
        try:
            fn = functions.get(path)
            if fn is None:
                module, _, attr = path.partition(":")
                fn = functions[path] = getattr(importlib.import_module(module), attr)
            value = fn(*positional, **arguments)
            if inspect.isawaitable(value):
                value = asyncio.run(awaited(value))
            if max_chars is not None:
                reply = ("ok", tool_text(value)[:max_chars])
            else:
                try:
                    reply = ("ok", _plain(value))
                except TypeError as exc:
                    reply = ("value", f"returned {type(value).__name__} {value!r:.200}: {exc}")
        except BaseException as exc:  # noqa: BLE001 - the tool's failure is the model's observation
            text = str(exc)
            reply = ("error", (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:max_chars])
        _write(out, reply)


async def awaited(awaitable: Any) -> Any:
    return await awaitable


if __name__ == "__main__":
    main()
