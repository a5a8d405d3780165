"""TRL's ``environment_factory``: a class, one instance per trajectory, its methods the tools.

    class Calculator:
        def reset(self, **row) -> str | None:     # every column of the row; a string extends the prompt
            self.calls = 0
        def add(self, a: int, b: int) -> int:      # a public method is a tool (schema: hints + docstring)
            \"\"\"Add two integers.

            Args:
                a: the first.
                b: the second.
            \"\"\"
            self.calls += 1
            return a + b
        def get_reward(self) -> float:             # optional, sync or async: one more reward, weight 1,
            return float(self.calls > 0)           # logged under the class's name

    DatasetTasks(rows, environment_factory=Calculator, ...)        # or {"calc": Calculator, "game": Game}
    environment: my_envs:Calculator                                # YAML (or {calc: my_envs:Calculator, ...})

The contract is TRL 1.16's ``GRPOTrainer``: the class is called with no argument, once per
trajectory; ``reset(**row)`` gets the row's columns (with a ``{name: class}`` mapping, each row's
``environment`` column names its class and is not passed); a string it returns is appended to the
last prompt message's content (``None``: the prompt as it is); the public methods other than
``reset`` and ``get_reward`` (functions defined on the class, read from the class without making
an instance) are the episode's tools besides ``tools=``, their schemas from
``transformers.utils.get_json_schema``. ``get_reward()`` runs once, when the episode ends. The
instance is discarded at the end of its episode (TRL 1.16 pools instances and resets them for its
next batch; a fresh one per trajectory is the same to a class whose ``reset`` resets its state).

Isolation: the instance lives in a worker process of its own (:mod:`..tools.workers`, confined by
the source's ``worker_limits`` as tool workers are; the module :mod:`..tools._episode_host` holds
it): ``reset``, each tool call and ``get_reward`` are calls into that process, each with a deadline (a tool
call ``tool_timeout_s``; ``reset`` and
``get_reward`` the rewards' deadline) past which the process is killed: a tool call then answers
``[tool error]`` and the instance is gone for the rest of the episode (each later call says so),
a ``reset`` past it fails the trajectory, a ``get_reward`` past it is a reward error. The process
is killed when the episode closes. A class no worker can import (defined in ``__main__`` or in a
function) runs in a thread of the engine's process, one per episode, with the same deadlines:
past one the call is abandoned (a thread cannot be stopped) and the instance is gone as above.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import queue
import threading
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...core.errors import ConfigError
from ...core.user_code import import_object
from ..tools import Tool, ToolResult
from ..tools._episode_host import GONE, EpisodeObject
from ..tools.confine import WorkerLimits
from ..tools.python_tools import schema_of
from ..tools.worker_main import awaited, tool_text
from ..tools.workers import ToolOutcome, ToolWorkers, worker_path

__all__ = ["EnvironmentClass", "EnvironmentEpisode", "EpisodeLimits", "environment_classes"]

_HOST = "_episode_host"  # the worker imports it from its own directory (see ..tools._episode_host)
_SPECIAL = ("reset", "get_reward")


@dataclass(frozen=True, slots=True)
class EnvironmentClass:
    """What set-up learned of one class: its name, how a worker imports it (``path``; None: it runs
    in a thread), its tools' schemas (``(method, description, parameters)``) and whether it has
    ``get_reward``."""

    cls: type
    path: str | None
    methods: tuple[tuple[str, str, dict[str, Any]], ...]
    has_reward: bool

    @property
    def name(self) -> str:
        """The reward's name: the class's (TRL logs ``get_reward`` under it)."""
        return self.cls.__name__

    def tool_names(self) -> list[str]:
        return [m for m, _, _ in self.methods]


def _one_class(spec: Any, where: str) -> EnvironmentClass:
    cls = import_object(spec, "environment") if isinstance(spec, str) else spec
    if not isinstance(cls, type):
        raise ConfigError(
            f"{where}: give the environment's class (or 'module:Class' in YAML), got {type(cls).__name__} "
            f"{cls!r:.80}. Its tools are read from the class's methods; a factory function hides them "
            "(give the class, with defaults for its constructor's arguments)"
        )
    members = dict(inspect.getmembers(cls, predicate=inspect.isfunction))
    if "reset" not in members:
        raise ConfigError(
            f"{where}: {cls.__name__} has no reset method; an environment class defines "
            "reset(self, **row) -> str | None (TRL's environment_factory contract)"
        )
    methods, problems = [], []
    for name, fn in members.items():
        if name.startswith("_") or name in _SPECIAL:
            continue
        try:  # a bound method's schema, as TRL reads it from an instance (no self)
            parameters, description = schema_of(types.MethodType(fn, cls), f"{cls.__name__}.{name}")
        except ConfigError as exc:
            problems.append(str(exc))
            continue
        methods.append((name, description, parameters))
    if problems:
        raise ConfigError("\n".join(problems))
    return EnvironmentClass(cls, worker_path(cls), tuple(methods), "get_reward" in members)


def environment_classes(spec: Any) -> dict[str | None, EnvironmentClass]:
    """``{None: class}`` for one class, ``{name: class}`` for a mapping (rows pick theirs by their
    ``environment`` column); ConfigError with every problem."""
    if spec is None:
        return {}
    listed = dict(spec) if isinstance(spec, Mapping) else {None: spec}
    if not listed:
        raise ConfigError("environment_factory: an empty mapping; give a class or {name: class}")
    found, problems = {}, []
    for name, one in listed.items():
        try:
            found[name] = _one_class(one, "environment_factory" + (f"[{name!r}]" if name is not None else ""))
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("\n".join(problems))
    return found


@dataclass(frozen=True, slots=True)
class _Reply:
    value: Any = None
    error: str | None = None
    timed_out: bool = False


class _WorkerHost:
    """The instance in a worker process of its own (killed at a deadline and at close)."""

    def __init__(self, path: str, limits: WorkerLimits | None) -> None:
        self.path = path
        self.workers = ToolWorkers(max_idle=1, limits=limits)

    def run(
        self,
        what: str,
        positional: tuple[Any, ...],
        arguments: Mapping[str, Any],
        timeout_s: float,
        text: int | None,
        label: str,
    ) -> _Reply:
        got = self.workers.exchange(f"{_HOST}:{what}", positional, arguments, timeout_s, text)
        if isinstance(got, ToolOutcome):
            if got.timed_out:
                return _Reply(
                    error=f"{label} did not return within {timeout_s:g} s and was stopped", timed_out=True
                )
            return _Reply(error=f"{label}: its worker process exited before answering")
        status, payload = got
        return _Reply(payload) if status == "ok" else _Reply(error=str(payload))

    def start(self, row: Mapping[str, Any], timeout_s: float) -> _Reply:
        return self.run("start", (self.path,), row, timeout_s, None, "reset")

    def call(self, method: str, arguments: Mapping[str, Any], timeout_s: float, max_chars: int) -> _Reply:
        return self.run("call", (method,), arguments, timeout_s, max_chars, method)

    def reward(self, timeout_s: float) -> _Reply:
        return self.run("reward", (), {}, timeout_s, None, "get_reward")

    def close(self) -> None:
        self.workers.close()


class _ThreadHost:
    """The instance in a daemon thread of the engine's process, one call at a time with a deadline;
    a call past it is abandoned and the instance with it (every later call answers :data:`GONE`)."""

    def __init__(self, cls: type) -> None:
        self.cls, self.held = cls, EpisodeObject()
        self.calls: queue.Queue[Any] = queue.Queue()
        self.gone = False
        threading.Thread(target=self._serve, name=f"environment-{cls.__name__}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            job = self.calls.get()
            if job is None:
                return
            fn, box, done = job
            try:
                value = fn()
                if inspect.isawaitable(value):
                    value = asyncio.run(awaited(value))
                box.append(_Reply(value))
            except BaseException as exc:  # noqa: BLE001 - the user's failure is the caller's reply
                box.append(_Reply(error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__))
            done.set()

    def _run(self, fn: Any, timeout_s: float, what: str) -> _Reply:
        if self.gone:
            return _Reply(error=GONE)
        box: list[_Reply] = []
        done = threading.Event()
        self.calls.put((fn, box, done))
        if not done.wait(timeout_s):
            self.gone = True
            self.calls.put(None)  # the thread ends if the call ever returns
            return _Reply(
                error=f"{what} did not return within {timeout_s:g} s and was abandoned", timed_out=True
            )
        return box[0]

    def start(self, row: Mapping[str, Any], timeout_s: float) -> _Reply:
        return self._run(lambda: self.held.start(self.cls, dict(row)), timeout_s, "reset")

    def call(self, method: str, arguments: Mapping[str, Any], timeout_s: float, max_chars: int) -> _Reply:
        reply = self._run(lambda: self.held.call(method, dict(arguments)), timeout_s, method)
        if reply.error is not None:
            return reply
        return _Reply(tool_text(reply.value)[:max_chars])

    def reward(self, timeout_s: float) -> _Reply:
        return self._run(self.held.reward, timeout_s, "get_reward")

    def close(self) -> None:
        if not self.gone:
            self.gone = True
            self.calls.put(None)


@dataclass(frozen=True, slots=True)
class EpisodeLimits:
    """What bounds an episode's calls into the user's code: made once by the task source from its
    options (``DatasetTasks(tool_timeout_s=..., max_tool_result_chars=..., worker_limits=...)``)
    and carried whole to each episode, so a layer in between adds no parameter for them.

    Attributes:
        tool_timeout_s: the deadline of one tool call (a method call of the environment).
        timeout_s: the deadline of ``reset`` and ``get_reward``.
        max_chars: a tool result's text is cut to this many characters.
        workers: how the worker processes are confined (None: the defaults).
    """

    tool_timeout_s: float
    timeout_s: float
    max_chars: int
    workers: WorkerLimits | None = None


class EnvironmentEpisode:
    """One trajectory's instance of ``env`` (see the module docstring); not thread-safe (an episode
    is driven by one thread at a time)."""

    def __init__(self, env: EnvironmentClass, limits: EpisodeLimits) -> None:
        self.env, self.limits = env, limits
        self.host: _WorkerHost | _ThreadHost | None = None

    def reset(self, row: Mapping[str, Any]) -> str | None:
        """A fresh instance, reset with ``row``: the text to append to the prompt, or None.
        RuntimeError (the trajectory fails) when reset raised, overran its deadline or returned
        something else than a string or None."""
        self.close()
        self.host = (
            _WorkerHost(self.env.path, self.limits.workers)
            if self.env.path is not None
            else _ThreadHost(self.env.cls)
        )
        reply = self.host.start(row, self.limits.timeout_s)
        where = f"environment {self.env.name}.reset"
        if reply.error is not None:
            raise RuntimeError(f"{where}: {reply.error}")
        if reply.value is not None and not isinstance(reply.value, str):
            raise RuntimeError(
                f"{where} returned {type(reply.value).__name__} {reply.value!r:.120}: "
                "expected a string (appended to the prompt) or None"
            )
        return reply.value

    def tools(self) -> list[Tool]:
        """The class's methods as tools calling into this episode's instance."""
        return [
            Tool(name, description, parameters, _MethodHandler(self, name))
            for name, description, parameters in self.env.methods
        ]

    def call(self, method: str, arguments: Mapping[str, Any]) -> ToolResult:
        if self.host is None:
            return ToolResult(f"[tool error] {GONE}", error=GONE)
        reply = self.host.call(method, arguments, self.limits.tool_timeout_s, self.limits.max_chars)
        if reply.error is not None:
            error = (
                reply.error if reply.timed_out or reply.error == GONE else f"{method} raised {reply.error}"
            )
            return ToolResult(f"[tool error] {error}", error=error, timed_out=reply.timed_out)
        return ToolResult(str(reply.value))

    def reward(self) -> float | None:
        """``get_reward()``'s value (None: TRL's "not applicable"); RuntimeError when it raised,
        overran its deadline or gave something else than a finite number or None."""
        where = f"environment {self.env.name}.get_reward"
        if self.host is None:
            raise RuntimeError(f"{where}: the episode was never reset")
        reply = self.host.reward(self.limits.timeout_s)
        if reply.error is not None:
            raise RuntimeError(f"{where}: {reply.error}")
        value = reply.value
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise RuntimeError(f"{where} returned {value!r:.120}: expected a finite number or None")
        return float(value)

    def close(self) -> None:
        """Discard the instance (its worker process is killed)."""
        if self.host is not None:
            self.host.close()
            self.host = None


@dataclass(frozen=True, slots=True)
class _MethodHandler:
    episode: EnvironmentEpisode
    method: str

    def __call__(self, sandbox: Any, arguments: Mapping[str, Any]) -> ToolResult:
        del sandbox  # an environment's method gets its arguments only
        return self.episode.call(self.method, arguments)
