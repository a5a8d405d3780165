"""One environment instance, held where its episode's calls run (TRL's ``environment_factory``).

Standard library only: a tool worker (:mod:`.worker_main`, whose directory is first on its
``sys.path``) imports this file as ``_episode_host`` and calls its functions by ``module:name``
like any tool, so an episode's worker holds the instance between calls. The parent gives each
episode a worker of its own (:class:`~thundersync_lightning.envs.datasets.environments.EnvironmentEpisode`),
so nothing here is shared between episodes; a worker killed at a deadline takes the instance with
it, and a later call answers that the environment is gone. The same :class:`EpisodeObject` runs
in a thread of the engine's process for a class no worker can import (defined in ``__main__``).
"""

from __future__ import annotations

import importlib
from typing import Any

GONE = "the environment instance is gone (an earlier call of this episode overran its deadline)"


class EpisodeObject:
    """A class's instance: ``start`` builds it and resets it with the row, ``call`` runs one of its
    tool methods, ``reward`` its ``get_reward``. Values are returned as the methods give them
    (awaitables included: the caller awaits them)."""

    def __init__(self) -> None:
        self.instance: Any = None

    def start(self, cls: Any, row: dict[str, Any]) -> Any:
        self.instance = cls()
        return self.instance.reset(**row)

    def call(self, method: str, arguments: dict[str, Any]) -> Any:
        return getattr(self._live(), method)(**arguments)

    def reward(self) -> Any:
        return self._live().get_reward()

    def _live(self) -> Any:
        if self.instance is None:
            raise RuntimeError(GONE)
        return self.instance


_HELD = EpisodeObject()  # this worker's episode (one per worker: the parent never shares it)


def start(class_path: str, /, **row: Any) -> Any:
    """Import ``module:Class``, build one instance, return ``instance.reset(**row)``."""
    module, _, name = class_path.partition(":")
    cls = importlib.import_module(module)
    for part in name.split("."):
        cls = getattr(cls, part)
    return _HELD.start(cls, row)


def call(method: str, /, **arguments: Any) -> Any:
    """``instance.<method>(**arguments)``: one tool call (``method`` is positional-only, so a tool
    argument of any name reaches the method)."""
    return _HELD.call(method, arguments)


def reward() -> Any:
    """``instance.get_reward()``."""
    return _HELD.reward()
