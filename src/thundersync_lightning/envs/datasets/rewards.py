"""Reward functions, by name or import path, in TRL's, verl's or this project's convention.

A registry in the style of verl's ``register_*`` / ``get_*``: :func:`register_reward` adds a
callable under a name, :func:`resolve_reward` turns a YAML value into a callable:

    reward: exact_match                                   # a registered name
    reward: {name: regex_match, pattern: "^4$"}            # a name with fixed keyword arguments
    reward: {function: my_pkg.rewards:score, scale: 2}     # any importable callable ("module:attr")
    reward: my_pkg.rewards:score                           # the same without fixed arguments

How a function is called depends on its parameters (:mod:`.conventions`): TRL's
``f(prompts, completions, completion_ids, **columns) -> list[float | None]``, verl's
``compute_score(data_source, solution_str, ground_truth, extra_info)``, or
``reward(prompt, completion, **row) -> float | None``. Every column reaches it (``fields`` renames).

Built-ins (``row`` holds the dataset row's columns; ``answer`` is the reference):

    exact_match   1 if the completion, stripped, equals ``answer`` stripped (``ignore_case``)
    regex_match   1 if ``pattern`` (argument, or the row's ``pattern`` field) matches the completion
    math_answer   1 if the last number (or ``\\boxed{...}``) of the completion equals ``answer`` numerically
    unit_tests    1 if the completion's code passes the row's ``tests`` (Python source with asserts),
                  run in a bubblewrap sandbox (``python3 -I``, no network, own uid, limits)

``None`` declines the completion (see :mod:`.reward_sum`). A reward that raises, or returns
something that is neither a finite number nor None, is the trajectory's failure (reward 0,
``RewardReady.failure`` says which function and why): see :func:`call_reward`. A thread cannot be
stopped, so a user's reward function (it may sleep, loop or wait on a socket) runs in a confined
reward worker process killed past :data:`REWARD_TIMEOUT_S` (:mod:`..tools.workers`; an ``async
def`` one is awaited there). The built-ins run in the caller's thread: ``exact_match`` and
``math_answer`` are linear, ``unit_tests`` has its sandbox's deadline, and ``regex_match`` runs the
configured pattern (a pattern that backtracks catastrophically on the model's text stalls the
engine: the pattern is the user's to keep linear). So does a reward no worker can import by
``module:name`` (a lambda, a local function, one defined in ``__main__``).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...core.errors import ConfigError
from ...core.registry import Registry
from ...core.user_code import import_object
from ..tools.confine import WorkerLimits
from ..tools.workers import ToolOutcome, reward_workers, worker_path
from .conventions import RewardConvention, RewardError, RewardInput, convention_of

__all__ = [
    "RewardFn",
    "RewardError",
    "RewardInput",
    "register_reward",
    "get_reward",
    "resolve_reward",
    "call_reward",
    "check_reward_signature",
    "reward_names",
    "exact_match",
    "regex_match",
    "math_answer",
    "unit_tests",
]

RewardFn = Callable[..., float]
REWARD_TIMEOUT_S = 60.0  # past it a reward's worker process is killed and the trajectory fails

_REGISTRY: Registry[RewardFn] = Registry("reward", "or give {function: 'module:callable'}")


def register_reward(name: str, fn: RewardFn | None = None, *, overwrite: bool = False) -> Any:
    """Register ``fn`` as ``name``: ``@register_reward(name)`` or ``register_reward(name, fn)``
    (:class:`~thundersync_lightning.core.registry.Registry` rules: a taken name needs ``overwrite=True``)."""
    return _REGISTRY.register(name, fn, overwrite=overwrite)


def reward_names() -> list[str]:
    return list(_REGISTRY.names())


def get_reward(name: str) -> RewardFn:
    return _REGISTRY.get(name)


class _Bound:
    """A reward with fixed keyword arguments and its calling convention (picklable when the
    function is importable)."""

    def __init__(self, fn: RewardFn, name: str, kwargs: Mapping[str, Any]) -> None:
        self.fn, self.name, self.kwargs = fn, name, dict(kwargs)
        self.path = _worker_path(fn)  # None: runs in the caller's thread
        try:
            self.params: Mapping[str, inspect.Parameter] | None = dict(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            self.params = None
        self.convention: RewardConvention = convention_of(self.params)

    def __call__(self, prompt: Any, completion: str, **row: Any) -> float | None:
        """One trajectory's reward, in the caller's thread (a test's shortcut to :func:`call_reward`)."""
        return call_reward(self, RewardInput(prompt, completion, row))


def resolve_reward(spec: str | Mapping[str, Any] | RewardFn) -> _Bound:
    """A callable from a name, ``{name: ..., **kwargs}``,
    ``{function: "module:attr", **kwargs}`` or a callable."""
    if callable(spec):
        return _Bound(spec, getattr(spec, "__name__", type(spec).__name__), {})
    if isinstance(spec, str):
        if ":" in spec:  # "module:callable", as tools are named
            return resolve_reward({"function": spec})
        return _Bound(get_reward(spec), spec, {})
    if isinstance(spec, Mapping):
        kwargs = dict(spec)
        name, path = kwargs.pop("name", None), kwargs.pop("function", None)
        if (name is None) == (path is None):
            raise ConfigError(
                f"reward {dict(spec)!r}: give exactly one of 'name' (registered: "
                f"{', '.join(reward_names())}) or 'function' ('module:callable')"
            )
        if name is not None:
            return _Bound(get_reward(name), name, kwargs)
        fn = _import_reward(str(path))
        if not callable(fn):
            raise ConfigError(f"reward function {path!r} is not callable")
        return _Bound(fn, str(path), kwargs)
    raise ConfigError(f"reward must be a name, a mapping or a callable, got {type(spec).__name__}")


def _import_reward(path: str) -> Any:
    return import_object(path, "reward function")


def check_reward_signature(fn: _Bound, columns: Sequence[str], origin: str = "the data") -> list[str]:
    """Why ``fn`` cannot be called in its convention with ``columns`` and its fixed arguments
    (empty: it can, or its signature is not inspectable). Checked at construction: a mismatch would
    otherwise fail every trajectory with reward 0."""
    if fn.params is None:
        return []
    return fn.convention.problems(fn.name, fn.params, list(columns), fn.kwargs, origin)


def _worker_path(fn: RewardFn) -> str | None:
    """``module:name`` a worker process imports ``fn`` by, or None where it runs in the caller's
    thread (the linear and the sandboxed built-ins; what no worker can import)."""
    if fn in _IN_THREAD:
        return None
    return worker_path(fn)


def call_reward(
    fn: _Bound,
    inp: RewardInput | Any,
    completion: str | None = None,
    row: Mapping[str, Any] | None = None,
    timeout_s: float = REWARD_TIMEOUT_S,
    limits: WorkerLimits | None = None,
) -> float | None:
    """``fn``'s value for one trajectory (``inp``, or ``prompt, completion, row``): a float, or None
    where it declined; RewardError naming the function and what went wrong (it raised, returned
    neither a finite number nor None, or overran ``timeout_s`` in its worker process, confined by
    ``limits``, and was stopped)."""
    if not isinstance(inp, RewardInput):
        inp = RewardInput(inp, str(completion), dict(row or {}))
    positional, keywords = fn.convention.call(inp, fn.params, fn.kwargs)
    if fn.path is not None:
        got = reward_workers(limits).exchange(fn.path, positional, keywords, timeout_s, None)
        if isinstance(got, ToolOutcome):  # it never answered: stopped at the deadline, or its process died
            raise RewardError(f"reward {fn.name!r}: {got.error}")
        status, payload = got
        if status != "ok":
            raise RewardError(f"reward {fn.name!r} {'raised ' if status == 'error' else ''}{payload}")
        value: Any = payload
    else:
        try:
            value = fn.fn(*positional, **keywords)
            if inspect.isawaitable(value):  # an async def reward: this pool thread runs no event loop
                value = asyncio.run(_awaited(value))
        except Exception as exc:  # noqa: BLE001 - any failure of user code becomes the trajectory's failure
            raise RewardError(f"reward {fn.name!r} raised {type(exc).__name__}: {exc}") from exc
    return fn.convention.value(value, f"reward {fn.name!r}")


async def _awaited(value: Any) -> Any:
    return await value


# ---------------------------------------------------------------------- built-ins
@register_reward("exact_match")
def exact_match(
    prompt: str, completion: str, answer: Any = None, ignore_case: bool = False, **row: Any
) -> float:
    if answer is None:
        raise ValueError("exact_match needs the row's 'answer' field (map it with fields: {answer: ...})")
    a, b = completion.strip(), str(answer).strip()
    return float(a.lower() == b.lower() if ignore_case else a == b)


@register_reward("regex_match")
def regex_match(prompt: str, completion: str, pattern: str | None = None, **row: Any) -> float:
    if pattern is None:
        raise ValueError(
            "regex_match needs a pattern (reward: {name: regex_match, pattern: ...} or a row field)"
        )
    return float(re.search(pattern, completion) is not None)


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def _number(text: str) -> float | None:
    text = text.replace(",", "").strip()
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            return float(num) / float(den)
        return float(text)
    except (ValueError, ZeroDivisionError):
        return None


@register_reward("math_answer")
def math_answer(
    prompt: str, completion: str, answer: Any = None, tolerance: float = 1e-6, **row: Any
) -> float:
    if answer is None:
        raise ValueError("math_answer needs the row's 'answer' field")
    boxed = _BOXED.findall(completion)
    found = boxed[-1] if boxed else (_NUMBER.findall(completion.replace(",", "")) or [None])[-1]
    expected = _number(str(answer))
    if expected is None:
        raise ValueError(f"math_answer: the reference answer {answer!r} is not a number")
    got = _number(found) if found is not None else None
    return float(got is not None and abs(got - expected) <= tolerance * max(1.0, abs(expected)))


#: The host-written runner of ``unit_tests``. It takes the run's nonce from its stdin (a pipe the host
#: closed) and puts /dev/null in its place before any code of the completion runs, binds every
#: function it needs after that point, runs the completion and then the tests in one namespace,
#: clears trace and profile hooks between them, and writes the nonce as its last line only after the
#: last assert, with the ``os.write`` it bound first, then leaves with ``os._exit(0)``. An exit of
#: the completion (``sys.exit``, ``raise SystemExit``, ``os._exit``) or a failed assert ends the
#: process without it.
_UNIT_TEST_RUNNER = """\
import os, sys
def _main(
    write=os.write, leave=os._exit, run=exec, build=compile, trace=sys.settrace, profile=sys.setprofile
):
    nonce = bytearray(64)
    nonce[os.readv(0, [nonce]):] = b""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    with open("solution.py", encoding="utf-8") as f:
        solution = build(f.read(), "solution.py", "exec")
    with open("tests.py", encoding="utf-8") as f:
        tests = build(f.read(), "tests.py", "exec")
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    run(solution, scope)
    trace(None)
    profile(None)
    run(tests, scope)
    write(1, b"\\n")
    write(1, nonce)
    write(1, b"\\n")
    leave(0)
_main()
"""


@register_reward("unit_tests")
def unit_tests(
    prompt: str,
    completion: str,
    tests: str | None = None,
    timeout_s: float = 10.0,
    uid_base: int = 3_500_000,
    uid_count: int = 256,
    python: str = "python3",
    **row: Any,
) -> float:
    """Run ``completion`` (code, fenced or not), then ``tests``, in a bubblewrap sandbox: 1 only when
    every assert ran, proved by a per-run nonce the runner prints after the last one.

    The nonce reaches the sandbox on the runner's stdin only (no file, argument or environment
    variable holds it) and is read before the completion runs; the completion's exits score 0.
    What the completion can still do in the interpreter it shares with the asserts (read the
    runner's frame, rewrite the tests' functions) is the in-process limit in docs/security.md.
    """
    from ..sandbox.base import SandboxLimits
    from ..sandbox.bwrap import BwrapConfig, BwrapSandbox, chown_tree
    from ..sandbox.fs import BoundedDir
    from ..sandbox.uids import UidPool

    if tests is None:
        raise ValueError("unit_tests needs the row's 'tests' field (Python source with asserts)")
    fenced = re.findall(r"```(?:python)?\n(.*?)```", completion, re.S)
    code = fenced[-1] if fenced else completion
    lease = _pool(UidPool, uid_base, uid_count).acquire()
    root = "/tmp/thundersync-reward-sandboxes"
    os.makedirs(root, mode=0o711, exist_ok=True)
    limits = SandboxLimits(
        timeout_s=timeout_s, nproc=64, memory_bytes=512 * 1024**2, disk_bytes=64 * 1024**2, disk_inodes=10_000
    )
    work = tempfile.mkdtemp(dir=root)
    budget = None
    nonce = secrets.token_hex(16).encode()
    try:
        budget = BoundedDir(work, limits.disk_bytes, limits.disk_inodes, 0o700)
        for name, text in (("runner.py", _UNIT_TEST_RUNNER), ("solution.py", code), ("tests.py", tests)):
            with open(os.path.join(work, name), "w", encoding="utf-8") as f:
                f.write(text + "\n")
        chown_tree(work, lease.uid)
        box = BwrapSandbox(work, lease.uid, BwrapConfig(limits=limits), budget=budget)
        result = box.run(f"exec {python} -I runner.py", stdin=nonce)
        lines = result.output.rstrip(b"\n").rsplit(b"\n", 1)
        return float(result.ok and not result.truncated and lines[-1] == nonce)
    finally:
        if budget is not None:
            budget.remove()
        else:
            shutil.rmtree(work, ignore_errors=True)
        lease.release()


_pools: dict[tuple[int, int], Any] = {}


def _pool(cls: Any, base: int, size: int) -> Any:
    return _pools.setdefault((base, size), cls(base, size))


_IN_THREAD = (exact_match, regex_match, math_answer, unit_tests)  # a worker would import the package (torch)
