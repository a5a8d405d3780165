"""Reward functions of a user's module, imported by ``module:name`` in a reward worker process."""

from __future__ import annotations

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
