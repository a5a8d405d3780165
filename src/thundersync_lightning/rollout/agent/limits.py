"""How long a learner waits for a step's next rollout event: derived from the limits that bound
every event, so no wait is unbounded and no bounded episode is cut off.

An episode's events come after at most ``max_turns`` environment calls of ``step_timeout_s`` each
and one verdict of ``verdict_timeout_s``; generation gets as much again (the factor 2), and
``slack_s`` covers what else may delay a step: a start-up, an engine restart. Every engine's
``"auto"`` wait is :func:`event_wait_s` (the embedded engine's slack is its ``startup_timeout_s``;
the vLLM engines' :data:`VLLM_SLACK_S`). An unbounded environment call (a limit of None) leaves
the wait unbounded too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["VLLM_SLACK_S", "EventLimits", "check_event_timeout", "event_wait_s", "warn_if_short"]

log = logging.getLogger(__name__)

VLLM_SLACK_S = 600.0  # generation of a long step plus one engine restart (vLLM's start on a GPU)


def event_wait_s(
    max_turns: int, step_timeout_s: float | None, verdict_timeout_s: float | None, slack_s: float
) -> float | None:
    """``slack_s + 2 * (max_turns * step_timeout_s + verdict_timeout_s)``; None when either limit is None."""
    if step_timeout_s is None or verdict_timeout_s is None:
        return None
    return slack_s + 2.0 * (max(1, max_turns) * step_timeout_s + verdict_timeout_s)


def warn_if_short(
    owner: str,
    explicit_s: float,
    max_turns: int,
    step_timeout_s: float | None,
    verdict_timeout_s: float | None,
) -> None:
    """Warn when an explicit wait is shorter than one episode's own bound (``max_turns`` calls and a
    verdict): a healthy step could then fail with EngineError."""
    if step_timeout_s is None or verdict_timeout_s is None:
        return
    episode = max(1, max_turns) * step_timeout_s + verdict_timeout_s
    if explicit_s < episode:
        log.warning(
            "%s.event_timeout_s=%g s is shorter than one episode may take (max_turns %d x step_timeout_s "
            "%g + verdict_timeout_s %g = %g s): a healthy step can fail with EngineError; use 'auto'",
            owner,
            explicit_s,
            max_turns,
            step_timeout_s,
            verdict_timeout_s,
            episode,
        )


@dataclass(frozen=True, slots=True)
class EventLimits:
    """The vLLM engine configs' waits, from their ``event_timeout_s``, ``step_timeout_s`` and
    ``verdict_timeout_s`` fields (``"auto"``: :func:`event_wait_s` with :data:`VLLM_SLACK_S`). A
    dataclass without fields, so its configs stay pure dataclasses (jsonargparse reads their fields)."""

    def event_limit_s(self, max_turns: int) -> float | None:
        """How long the rollout iterator, and a publish waiting for earlier requests, wait for an
        event (None: unbounded, as the environment calls are)."""
        # the subclass's fields (declared there: fields here would come first in its __init__)
        explicit = getattr(self, "event_timeout_s")  # noqa: B009
        step, verdict = getattr(self, "step_timeout_s"), getattr(self, "verdict_timeout_s")  # noqa: B009
        if explicit == "auto":
            return event_wait_s(max_turns, step, verdict, VLLM_SLACK_S)
        warn_if_short(type(self).__name__, float(explicit), max_turns, step, verdict)
        return float(explicit)

    @property
    def transfer_timeout_s(self) -> float:
        """A publish's bucket transfers: an explicit ``event_timeout_s``, else :data:`VLLM_SLACK_S`
        (a transfer's time depends on the weights, not on the episodes)."""
        explicit = getattr(self, "event_timeout_s")  # noqa: B009
        return VLLM_SLACK_S if explicit == "auto" else float(explicit)


def check_event_timeout(value: object) -> list[str]:
    """The problem with an ``event_timeout_s`` value (a config's ``__post_init__`` collects it)."""
    if value == "auto" or (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
        return []
    return [f"event_timeout_s must be > 0 seconds or 'auto', got {value!r}"]
