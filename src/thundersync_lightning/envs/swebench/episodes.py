"""Per-episode phase times of SWE-bench workspaces, one JSON line per episode.

:class:`TimedWorkspace` wraps an episode's workspace and times what it does, in the order
:class:`~..repo.episode.CodeEnv` calls it:

    container_start_s   ``open``: the image's /testbed copied out, the base commit copied, the shell
    commands_s          every agent command (``run``), ``commands`` of them
    verdict_s           the patch capture (``diff``) and the graded eval run (``evaluate``)

and, when the workspace closes, appends to :class:`EpisodeLog` (``DIR/episodes.jsonl``)::

    {"instance_id", "seed", "started_at", "episode_s", "container_start_s", "commands",
     "commands_s", "verdict_s", "reward", "resolved", "verdict", "tests": {"FAIL_TO_PASS": {...},
     "PASS_TO_PASS": {...}}, "error"}

``started_at`` is wall-clock (``time.time()``); the durations are ``time.monotonic()`` differences.
``episode_s`` runs from ``open`` to ``close`` (generation included: the policy acts in between).
An episode that never reached a verdict has ``reward`` null and ``verdict`` null; ``error`` names
what raised. Writing never raises into the episode: a log that cannot be written is warned once.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from ..repo.episode import Workspace
from ..repo.grading import EvalOutcome
from ..sandbox.base import SandboxResult

__all__ = ["EpisodeLog", "TimedWorkspace", "read_episodes"]

log = logging.getLogger(__name__)


class EpisodeLog:
    """Appends one JSON line per record to ``path`` (one ``write`` of the whole line on an
    ``O_APPEND`` descriptor: lines from concurrent episodes never interleave)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._warned = False
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as e:
            with self._lock:
                if not self._warned:
                    self._warned = True
                    log.warning("cannot write the episode log %s: %s", self.path, e)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]


def read_episodes(path: str) -> list[dict[str, Any]]:
    """The records of an episode log (lines that do not parse are skipped: a run killed mid-write)."""
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


class TimedWorkspace:
    """``inner`` with its phases timed; the record goes to ``episodes`` on ``close``."""

    def __init__(self, inner: Workspace, episodes: EpisodeLog, instance_id: str, seed: int) -> None:
        self.inner, self.episodes = inner, episodes
        self.record: dict[str, Any] = {
            "instance_id": instance_id,
            "seed": seed,
            "started_at": None,
            "episode_s": None,
            "container_start_s": None,
            "commands": 0,
            "commands_s": 0.0,
            "verdict_s": 0.0,
            "reward": None,
            "resolved": None,
            "verdict": None,
            "tests": None,
            "error": None,
        }
        self._opened_at: float | None = None
        self._closed = False
        self._lock = threading.Lock()

    def _error(self, where: str, exc: BaseException) -> None:
        self.record["error"] = self.record["error"] or f"{where}: {type(exc).__name__}: {str(exc)[:300]}"

    def open(self) -> None:
        self.record["started_at"] = time.time()
        self._opened_at = t0 = time.monotonic()
        try:
            self.inner.open()
        except BaseException as e:
            self._error("open", e)
            raise
        finally:
            self.record["container_start_s"] = time.monotonic() - t0

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout_s: float | None = None
    ) -> SandboxResult:
        t0 = time.monotonic()
        try:
            return self.inner.run(command, stdin=stdin, timeout_s=timeout_s)
        finally:
            with self._lock:
                self.record["commands"] += 1
                self.record["commands_s"] += time.monotonic() - t0

    def diff(self) -> str | None:
        t0 = time.monotonic()
        try:
            return self.inner.diff()
        except BaseException as e:
            self._error("diff", e)
            raise
        finally:
            self.record["verdict_s"] += time.monotonic() - t0

    def evaluate(self, patch: str) -> EvalOutcome:
        t0 = time.monotonic()
        try:
            outcome = self.inner.evaluate(patch)
        except BaseException as e:
            self._error("evaluate", e)
            raise
        finally:
            self.record["verdict_s"] += time.monotonic() - t0
        status = outcome.report.get("tests_status") if isinstance(outcome.report, dict) else None
        self.record.update(
            reward=outcome.reward, resolved=outcome.resolved, verdict=outcome.reason, tests=_counts(status)
        )
        return outcome

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            with self._lock:
                first, self._closed = not self._closed, True
            if first and self._opened_at is not None:
                self.record["episode_s"] = time.monotonic() - self._opened_at
                self.episodes.write(dict(self.record))

    def __getattr__(self, name: str) -> Any:  # protects(), host, ...: the inner workspace's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def _counts(status: Any) -> dict[str, dict[str, int]] | None:
    """swebench's tests_status as counts (success / failure per FAIL_TO_PASS and PASS_TO_PASS)."""
    if not isinstance(status, dict):
        return None
    return {
        k: {
            "success": len(status.get(k, {}).get("success", [])),
            "failure": len(status.get(k, {}).get("failure", [])),
        }
        for k in ("FAIL_TO_PASS", "PASS_TO_PASS")
    }
