"""Event intake of one step: engine events in, checked, recorded and handed to the accumulator.

A pump thread per event stream (the request's, and each dynamic-sampling replacement's) moves
events into one queue; the learner drains it between calls. Each event is checked (requested by
this step, fresh enough, not delivered twice) and recorded in the step's :class:`StepOutcome`.
A reward is shaped with its trajectory's length when the objective shapes rewards
(``Objective.overlong_*``); one that arrives before its content waits for it. A graded reward
beyond ``Objective.max_abs_reward`` becomes a failure that says so (``RewardError``). Every verdict is
noted in the accumulator's plan (its group opened or not). A group is admitted (opened in the
accumulator) when the open-group bound allows; until then its events wait. An admitted group's
reward goes to the accumulator at once (a *fold* interval); its content waits in :attr:`waiting`
for the learner.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace

from ..core.accumulator.streaming import StreamingGRPO
from ..core.errors import EngineError, UnknownTrajectoryError
from ..core.snapshot import PolicySnapshot
from ..core.types import ContentReady, RewardReady, RolloutEvent, RolloutRequest
from .records import StepOutcome
from .stats import Interval

__all__ = ["EventIntake"]

_END = object()


class EventIntake:
    """The step's event queue and what each event does (module docstring).

    ``after_verdict(group_id)`` is called after every reward; the event stream it returns (a
    replacement's) joins the queue.
    """

    def __init__(
        self,
        request: RolloutRequest,
        snapshot: PolicySnapshot,
        allowed_staleness: int,
        accumulator: StreamingGRPO,
        outcome: StepOutcome,
        clock: Callable[[], float],
        after_verdict: Callable[[str], Iterator[RolloutEvent] | None] | None = None,
    ) -> None:
        self.request = request
        self.snapshot = snapshot
        self.allowed = allowed_staleness
        self.acc = accumulator
        self.outcome = outcome
        self.clock = clock
        self.after_verdict = after_verdict
        self.waiting: dict[str, None] = {}  # admitted groups' content not yet backpropagated (ordered)
        self.content_at: dict[str, float] = {}  # when each trajectory's content landed in the queue
        self._landed = 0.0  # when the event being dispatched landed in the queue (the pump's clock)
        self._admitted: set[str] = set()
        self._deferred: dict[str, list[RolloutEvent]] = {}
        self._early: dict[str, RewardReady] = {}  # rewards waiting for their content (reward shaping)
        self._inbox: queue.Queue = queue.Queue()
        self._streams = 0

    @property
    def has_deferred(self) -> bool:
        """A group waits for the open-group bound (admitted only after the learner closes one)."""
        return bool(self._deferred)

    @property
    def empty(self) -> bool:
        return self._inbox.empty()

    def start(self, events: Iterator[RolloutEvent]) -> None:
        self._streams += 1
        pump = threading.Thread(
            target=_pump, args=(events, self._inbox, self.clock), name="thundersync-events", daemon=True
        )
        pump.start()

    def drain(self, block: bool, timeout: float | None = None) -> bool:
        """Dispatch every event available now (waiting for one if ``block``, at most ``timeout``
        seconds when given); True at the end."""
        inbox = self._inbox
        if block:
            try:
                item = inbox.get(timeout=timeout)
            except queue.Empty:
                return False
        else:
            item = _get_nowait(inbox)
        while item is not None:
            if item is _END:
                self._streams -= 1
                if self._streams == 0:
                    return True
                item = _get_nowait(inbox)
                continue
            if isinstance(item, BaseException):
                raise item
            self._landed, event = item
            self._dispatch(event)
            item = _get_nowait(inbox)
        return False

    def after_change(self) -> None:
        """After the learner's work: record the open-group count and admit waiting groups it freed."""
        if len(self.acc.open_groups) != (self.outcome.open_groups[-1][1] if self.outcome.open_groups else -1):
            self._mark_open_groups()
            self._drain_deferred()

    # ------------------------------------------------------------------ one event
    def _dispatch(self, event: RolloutEvent) -> None:
        tid = event.trajectory.trajectory_id if isinstance(event, ContentReady) else event.trajectory_id
        planned = self.acc.planned
        gid = planned.owner(tid)
        if gid is None:
            raise UnknownTrajectoryError(
                f"the engine delivered trajectory {tid!r}, which step {self.request.step} did not request "
                f"(groups {sorted(planned.membership)} of size "
                f"{self.request.groups[0].size if self.request.groups else 0}); "
                "the engine's group size or step does not match the data module's"
            )
        if isinstance(event, ContentReady):
            self._on_content(event)
            early = self._early.pop(tid, None)
            if early is not None:  # its reward came first and waited for the length
                self._dispatch(early)
        else:
            graded = not (event.failure or event.unscorable)
            if self.acc.shapes_rewards and graded:  # the overlong penalty needs the trajectory's length
                content = self.outcome.trajectories.get(tid)
                if content is None:
                    self._early[tid] = event
                    return
                event = replace(event, reward=self.acc.shaped_reward(event.reward, content.num_scored_tokens))
            refused = self.acc.refused_reward(event.reward) if graded else None
            if refused is not None:  # a failure the episode caused: it scores the floor
                event = replace(event, reward=0.0, failure=f"RewardError: {refused}", parts=())
            self._on_reward(event)
            more = self.after_verdict(gid) if self.after_verdict is not None else None
            if more is not None:
                self.start(more)
        if gid not in self._admitted and not self._admit(gid):
            self._deferred.setdefault(gid, []).append(event)
            return
        self._apply(event)

    def _on_content(self, event: ContentReady) -> None:
        t = event.trajectory
        self.snapshot.check_fresh(t.trajectory_id, t.policy_version, self.allowed)
        if t.trajectory_id in self.outcome.trajectories:
            raise EngineError(f"the engine delivered the content of {t.trajectory_id!r} twice")
        self.outcome.trajectories[t.trajectory_id] = t
        self.content_at[t.trajectory_id] = self._landed

    def _on_reward(self, event: RewardReady) -> None:
        if event.trajectory_id in self.outcome.rewards:
            raise EngineError(f"the engine delivered the reward of {event.trajectory_id!r} twice")
        self.outcome.rewards[event.trajectory_id] = event.reward
        # the lag as the events landed, not as a busy learner drained them; a reward before its content: 0
        content = self.content_at.get(event.trajectory_id)
        self.outcome.reward_lags.append(0.0 if content is None else max(0.0, self._landed - content))
        self.outcome.reward_times[event.trajectory_id] = event.time
        host_fault = bool(event.failure) and event.host_fault  # only a host fault may be dropped
        if event.failure:
            self.outcome.failures[event.trajectory_id] = event.failure
            if event.host_fault:
                self.outcome.host_faults.add(event.trajectory_id)
        if event.parts:
            self.outcome.reward_parts[event.trajectory_id] = event.parts
        unscorable = event.unscorable and not event.failure
        if unscorable:
            self.outcome.unscorable.add(event.trajectory_id)
        self.acc.planned.note_verdict(
            event.trajectory_id,
            event.reward,
            failed=host_fault,
            failure=bool(event.failure),
            unscorable=unscorable,
        )

    def _admit(self, gid: str) -> bool:
        limit = self.acc.max_open_groups
        if limit is not None and len(self.acc.open_groups) >= limit:
            return False
        self.acc.open_group(gid, self.acc.planned.members(gid))
        self._admitted.add(gid)
        self._mark_open_groups()
        return True

    def _apply(self, event: RolloutEvent) -> None:
        """Hand an admitted group's event to the accumulator (content waits for the learner)."""
        if isinstance(event, ContentReady):
            self.waiting[event.trajectory.trajectory_id] = None
            return
        start = self.clock()
        self.acc.add_reward(
            event.trajectory_id,
            event.reward,
            failed=bool(event.failure),
            host_fault=event.host_fault,
            unscorable=event.unscorable,
        )
        self.outcome.busy.append(Interval(start, self.clock(), "fold"))
        self.after_change()

    def _drain_deferred(self) -> None:
        while self._deferred:
            gid = next(iter(self._deferred))
            if not self._admit(gid):
                return
            for event in self._deferred.pop(gid):
                self._apply(event)

    def _mark_open_groups(self) -> None:
        self.outcome.open_groups.append((self.clock(), len(self.acc.open_groups)))


def _pump(events: Iterator[RolloutEvent], inbox: queue.Queue, clock: Callable[[], float]) -> None:
    """Move events into the queue as the engine produces them, each with the time it landed; an
    error travels as an item."""
    try:
        for event in events:
            inbox.put((clock(), event))
    except BaseException as err:  # noqa: BLE001 - re-raised on the learner thread
        inbox.put(err)
    inbox.put(_END)


def _get_nowait(inbox: queue.Queue) -> object | None:
    try:
        return inbox.get_nowait()
    except queue.Empty:
        return None
