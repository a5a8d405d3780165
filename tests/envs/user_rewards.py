"""Reward functions of a user's module, imported by ``module:name`` in a reward worker process."""

from __future__ import annotations

import functools
import time


def endless(prompt, completion, **row):  # noqa: ANN001, ANN003, ANN201
    time.sleep(3600)  # never returns: the worker is stopped at the reward's deadline
    return 1.0


def yes(prompt, completion, **row):  # noqa: ANN001, ANN003, ANN201
    return True  # not a number: refused


def length(prompt, completion, scale=1.0, **row):  # noqa: ANN001, ANN003, ANN201
    return scale * len(completion)


def explode(prompt, completion, **row):  # noqa: ANN001, ANN003, ANN201
    raise ValueError(f"cannot score {completion!r}")


async def later(prompt, completion, **row):  # noqa: ANN001, ANN003, ANN201
    return 0.25  # a coroutine function: the worker awaits it


def _scaled(fn):  # noqa: ANN001, ANN202
    @functools.wraps(fn)
    def wrapper(prompt, completion, **row):  # noqa: ANN001, ANN003, ANN202
        return 2.0 * fn(prompt, completion, **row)

    return wrapper


doubled_length = _scaled(length)  # carries length's __qualname__: a worker must import this name


def hungry(prompt, completion, **row):  # noqa: ANN001, ANN003, ANN201
    return float(len(bytearray(600 * 1024**2)) > 0)  # 600 MiB: within the default 1 GiB, not within 512 MiB
