"""One RL step's event loop on one learner process.

Streaming (and async): a pump thread moves the engine's events into a queue; the learner drains
it and never idles while work exists. What it backpropagates next, one ``add_tokens`` call at a
time with the queue drained in between, is :func:`~thundersync_lightning.strategy.batching.next_batch`'s
choice: fully rewarded groups' trajectories together, else the largest (group, reward) bucket,
else one reward-pending trajectory, whose gradient is held, only when the queue is empty and fewer
than ``max_held_trajectories`` gradients are held (otherwise it waits for its reward, which frees a
held gradient into its group's sum, and keeps doing reward-known work meanwhile). The learner
waits only when no work is left that fits the bounds. Sync (``defer=True``): the learner does nothing until
the last event, then the same accumulator processes the whole batch (every reward known: the
direct path), so every mode trains the same objective through the same code.

Reward shaping (``Objective.overlong_*``): a reward is shaped with its trajectory's length as it is
dispatched; one that arrives before its content waits for it. ``StepOutcome.rewards`` holds the
shaped rewards (what the group statistics see).

Dynamic sampling (``reserve`` and ``issue``): when every verdict of a group is in and the group
carries no signal (:func:`~thundersync_lightning.core.grpo.group_filter.informative`, the accumulator's own
test: it filters that group), the next reserve group is issued at once, from the weights the
engine holds (this step's in streaming and sync: staleness 0), and its events join the stream;
until the reserve is spent. Every mode issues the same replacements (sync waits for them before
its learner work), so they train on the same kept groups.

The runner measures what the learner did: busy intervals (scoring/backward, folds), waiting
(everything else), the open-group count over time and each trajectory's staleness.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from ..core.accumulator.boundary_cut import SharedPrefix
from ..core.accumulator.streaming import StreamingGRPO
from ..core.errors import ConfigError, EngineError, GroupError, UnknownTrajectoryError
from ..core.grpo.group_filter import informative
from ..core.grpo.terms import (
    TokenScores,
    engine_logprobs,
    entropy_threshold,
    mark_truncated,
    teacher_logprobs,
)
from ..core.snapshot import PolicySnapshot
from ..core.types import ContentReady, GroupRequest, RewardReady, RolloutEvent, RolloutRequest, Trajectory
from .batching import Batch, count_destinations, next_batch
from .stats import Interval, RolloutProgress, TrajectoryRecord

__all__ = ["StepRunner", "StepOutcome"]

ScoreFn = Callable[..., TokenScores]  # (trajectories, prefix=None[, watch=]) -> TokenScores
EncodeFn = Callable[[Sequence[int]], SharedPrefix]


@dataclass
class StepOutcome:
    trajectories: dict[str, Trajectory] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)
    reward_times: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    reward_parts: dict[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    host_faults: set[str] = field(default_factory=set)  # failures that may be dropped (failed="drop")
    busy: list[Interval] = field(default_factory=list)
    open_groups: list[tuple[float, int]] = field(default_factory=list)
    learner_tokens: int = 0
    min_batch_trajectories: int = 1  # the rows a call waited for while content was to land
    groups_generated: int = 0  # groups requested this step, replacements included
    groups_filtered: int = 0  # dynamic sampling: groups whose verdicts carried no signal

    def records(self, version: int) -> tuple[TrajectoryRecord, ...]:
        out = []
        for tid, t in self.trajectories.items():
            out.append(
                TrajectoryRecord(
                    trajectory_id=tid,
                    group_id=t.group_id,
                    policy_version=t.policy_version,
                    staleness=version - t.policy_version,
                    reward=self.rewards.get(tid),
                    num_tokens=len(t.tokens),
                    num_scored_tokens=t.num_scored_tokens,
                    num_turns=t.num_turns,
                    finish_reason=t.finish_reason,
                    failure=self.failures.get(tid) or t.failure,
                    content_ready_at=t.content_ready_at,
                    reward_ready_at=self.reward_times.get(tid),
                    prompt=t.prompt,
                    segments=t.segments,
                    tool_calls=t.tool_calls,
                    invalid_tool_calls=t.invalid_tool_calls,
                    tool_errors=t.tool_errors,
                    tool_timeouts=t.tool_timeouts,
                    tool_error=t.tool_error,
                    reward_parts=self.reward_parts.get(tid, ()),
                )
            )
        return tuple(out)


class StepRunner:
    """Consumes one request's events; see the module docstring.

    Args:
        request: this rank's share of the step.
        snapshot: the policy being updated; staleness = its version - the rollout's version.
        allowed_staleness: 0 in streaming/sync, 1 in async; a larger one raises StalenessError.
        accumulator: the step's StreamingGRPO. Its backward backend
            (:mod:`~thundersync_lightning.core.gradients.backward`) says how many destinations one call may
            span and what a call's scoring runs inside (``score`` then takes ``watch=``).
        score: the policy's per-token scores (``score_tokens`` with the objective's needs).
        defer: do no learner work before the event stream ends (the synchronous baseline).
        encode: the boundary cut: a group's shared prompt is run forward once by this function
            (``encode_prefix`` of the policy) and its members are scored on it (None: no cut).
        progress: called with a RolloutProgress at most every ``progress_interval_s`` and at the end.
        reserve, issue: dynamic sampling (module docstring): the replacement groups in the order
            they are issued, and the engine call that issues one (``engine.rollout``); the
            accumulator must filter groups (``StreamingGRPO(filter_groups=True)``).
        max_batch_trajectories, max_batch_tokens: the most trajectories, and the most tokens
            (``len(trajectory.tokens)``, prompt included), of one call; a trajectory longer than
            ``max_batch_tokens`` is a call of its own (None: no token bound).
        min_batch_trajectories: while the engine still has content to deliver, the learner starts
            a call only once this many trajectories (or ``max_batch_tokens`` tokens) are waiting;
            1: at once (where a call's fixed cost is large against a row's, waiting for rows
            trades a little idle learner time for less learner work; the gradient is unchanged).
    """

    def __init__(
        self,
        request: RolloutRequest,
        snapshot: PolicySnapshot,
        allowed_staleness: int,
        accumulator: StreamingGRPO,
        score: ScoreFn,
        progress: Callable[[RolloutProgress], None] | None = None,
        progress_interval_s: float = 0.2,
        max_batch_trajectories: int = 32,
        max_batch_tokens: int | None = None,
        min_batch_trajectories: int = 1,
        clock: Callable[[], float] = time.monotonic,
        defer: bool = False,
        encode: EncodeFn | None = None,
        reserve: Sequence[GroupRequest] = (),
        issue: Callable[[RolloutRequest], Iterator[RolloutEvent]] | None = None,
    ) -> None:
        if accumulator.objective.selects_tokens_by_entropy and not defer:
            raise ConfigError(
                f"top_entropy_quantile={accumulator.objective.top_entropy_quantile} selects tokens by a threshold over "
                "every scored token of the step, known only once the last trajectory landed; streaming and async "
                "backpropagate trajectories before that, so they cannot apply it exactly. Use mode='sync' "
                "(it runs one no-grad forward of the step first), or top_entropy_quantile=1"
            )
        if reserve and (issue is None or not accumulator.filter_groups):
            raise GroupError("StepRunner: replacement groups need issue= and an accumulator with filter_groups=True")
        self.defer = defer
        self.encode = encode
        self._prefixes: dict[str, SharedPrefix] = {}
        self.max_batch = max(1, max_batch_trajectories)
        self.max_tokens = max_batch_tokens
        self.min_batch = max(1, min(min_batch_trajectories, self.max_batch))
        self._waiting: dict[str, None] = {}  # admitted groups' content not yet backpropagated (ordered)
        self.request = request
        self.snapshot = snapshot
        self.allowed = allowed_staleness
        self.acc = accumulator
        self.score = score
        self.progress = progress
        self.progress_interval_s = progress_interval_s
        self.clock = clock
        self._members = request.trajectory_ids()
        self._owner = {t: g for g, ts in self._members.items() for t in ts}
        self._admitted: set[str] = set()
        self._deferred: dict[str, list[RolloutEvent]] = {}
        self.outcome = StepOutcome(min_batch_trajectories=self.min_batch, groups_generated=len(request.groups))
        self._reserve = list(reserve)
        self._issue = issue
        self._decided: set[str] = set()
        self._entropy_threshold: float | None = None  # top_entropy_quantile: the step's (sync only)
        self._early: dict[str, RewardReady] = {}  # rewards waiting for their content (reward shaping)
        self._inbox: queue.Queue = queue.Queue()
        self._streams = 0
        self._start = clock()
        self._last_progress = float("-inf")

    # ------------------------------------------------------------------ public
    def run(self, events: Iterator[RolloutEvent]) -> StepOutcome:
        inbox = self._inbox
        self._start_stream(events)
        ended = False
        while True:
            if not ended:
                ended = self._drain(inbox, block=not self._has_work(ended))
            if ended and self.acc.objective.selects_tokens_by_entropy and self._entropy_threshold is None:
                self._entropy_threshold = self._step_entropy_threshold()
            worked = self._work(inbox_empty=inbox.empty()) if ended or not self.defer else False
            self._report(final=False)
            if ended and not worked:
                break
        self._check_complete()
        self._report(final=True)
        return self.outcome

    def _drain(self, inbox: queue.Queue, block: bool) -> bool:
        """Dispatch every event available now (waiting for one if ``block``); True at the end."""
        item = inbox.get() if block else _get_nowait(inbox)
        while item is not None:
            if item is _END:
                self._streams -= 1
                if self._streams == 0:
                    return True
                item = _get_nowait(inbox)
                continue
            if isinstance(item, BaseException):
                raise item
            self._dispatch(item)
            item = _get_nowait(inbox)
        return False

    def _has_work(self, ended: bool) -> bool:
        if not self._waiting or not (ended or not self.defer) or self._gathering():
            return False
        return self._can_hold() or any(t in self.outcome.rewards for t in self._waiting)

    def _gathering(self) -> bool:
        """Wait for more content before the next call: fewer than ``min_batch_trajectories`` (and,
        with a token cap, fewer than ``max_batch_tokens`` tokens) are waiting while the engine has
        content still to deliver and no group is deferred (a deferred group is admitted only
        after the learner's work closes an open one, so waiting then could only stall)."""
        if self.min_batch <= 1 or len(self._waiting) >= self.min_batch or self._deferred:
            return False
        if len(self.outcome.trajectories) >= len(self._owner):
            return False
        return self.max_tokens is None or sum(self._lengths_of(self._waiting).values()) < self.max_tokens

    def _can_hold(self) -> bool:
        """Room to backpropagate one more reward-pending trajectory (its gradient is held)."""
        limit = self.acc.max_held_trajectories
        return limit is None or self.acc.held_trajectories < limit

    def _work(self, inbox_empty: bool) -> bool:
        """One unit of learner work; False when there was none."""
        dropped = [t for t in self._waiting if self._is_dropped(t)]
        for t in dropped:  # a failed verdict under failed="drop": never scored
            del self._waiting[t]
        if self._gathering():
            return bool(dropped)
        batch = next_batch(
            list(self._waiting),
            self.outcome.rewards,
            self._owner,
            self._members,
            self.max_batch,
            hold=self._room_to_hold() if inbox_empty else 0,
            destinations=self.acc.backend.destinations,
            lengths=self._lengths_of(self._waiting) if self.max_tokens is not None else None,
            max_tokens=self.max_tokens,
        )
        if batch is not None:
            self._backward(batch)
            return True
        return bool(dropped)

    def _lengths_of(self, tids: Iterable[str]) -> dict[str, int]:
        """Each trajectory's tokens, prompt included (what ``max_batch_tokens`` counts)."""
        return {t: len(self.outcome.trajectories[t].tokens) for t in tids}

    def _room_to_hold(self) -> int:
        """How many more reward-pending trajectories may be backpropagated now (their gradients held)."""
        limit = self.acc.max_held_trajectories
        return len(self._waiting) if limit is None else max(0, limit - self.acc.held_trajectories)

    def _is_dropped(self, tid: str) -> bool:
        return self.acc.objective.failed == "drop" and tid in self.outcome.host_faults

    def _backward(self, batch: Batch) -> None:
        tids = batch.trajectories
        start = self.clock()
        if self.encode is None:
            self._score_and_add(tids, None)
        else:
            by_group: dict[str, list[str]] = {}
            for t in tids:
                by_group.setdefault(self._owner[t], []).append(t)
            for gid, members in by_group.items():
                self._score_and_add(members, self._prefix_of(gid, members[0]))
            self._prefixes = {g: p for g, p in self._prefixes.items() if g in self.acc.open_groups}
        for t in tids:
            del self._waiting[t]
        tokens = sum(self._lengths_of(tids).values())
        self.outcome.busy.append(Interval(start, self.clock(), "backward", len(tids), batch.path, tokens))
        self._after_change()

    def _score_and_add(self, tids: list[str], prefix: SharedPrefix | None) -> None:
        trajectories = [self.outcome.trajectories[t] for t in tids]
        watch = self.acc.backend.watch(count_destinations(tids, self.outcome.rewards, self._owner, self._members))
        extra = {"watch": watch} if watch is not None else {}
        scores = self.score(trajectories, prefix=prefix, **extra)
        if self.acc.objective.selects_tokens_by_entropy:
            scores = replace(scores, entropy_threshold=self._entropy_threshold)
        if self.acc.objective.overlong_filter:
            scores = mark_truncated(scores, trajectories)
        engine = engine_logprobs(trajectories, scores.mask, scores.logprobs.dtype)
        teacher = None
        if self.acc.objective.needs_teacher:  # shipped by the engine: no teacher forward here
            teacher = teacher_logprobs(trajectories, scores.mask, scores.logprobs.dtype)
        self.acc.add_tokens(tids, scores, engine, teacher_logprobs=teacher, prefix=prefix, watch=watch)
        cut = len(prefix.tokens) if prefix is not None else 0
        self.outcome.learner_tokens += sum(len(t.tokens) - cut for t in trajectories)

    def _step_entropy_threshold(self) -> float:
        """``top_entropy_quantile``: one no-grad forward of every kept trajectory of the step, then the
        quantile of every scored token's entropy over all ranks (TRL gathers them too)."""
        tids = [t for t in self.outcome.trajectories if not self._is_dropped(t)]
        local = []
        with torch.no_grad():
            for k in range(0, len(tids), self.max_batch):
                chunk = [self.outcome.trajectories[t] for t in tids[k : k + self.max_batch]]
                scores = self.score(chunk)
                if scores.entropy is None:
                    raise ConfigError("top_entropy_quantile < 1 needs the policy's per-token entropies")
                local.append(scores.entropy[scores.mask].detach().cpu())
        gathered = local
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            every: list[list[torch.Tensor]] = [[] for _ in range(dist.get_world_size())]
            dist.all_gather_object(every, local)
            gathered = [t for part in every for t in part]
        return entropy_threshold(self.acc.objective.top_entropy_quantile, gathered)

    def _prefix_of(self, gid: str, tid: str) -> SharedPrefix:
        """The group's shared prompt, run forward once when its first member is scored."""
        prefix = self._prefixes.get(gid)
        if prefix is None:
            assert self.encode is not None
            prompt = self.outcome.trajectories[tid].prompt
            prefix = self._prefixes[gid] = self.encode(prompt)
            self.outcome.learner_tokens += len(prompt)
        return prefix

    # ------------------------------------------------------------------ events
    def _dispatch(self, event: RolloutEvent) -> None:
        tid = event.trajectory.trajectory_id if isinstance(event, ContentReady) else event.trajectory_id
        gid = self._owner.get(tid)
        if gid is None:
            raise UnknownTrajectoryError(
                f"the engine delivered trajectory {tid!r}, which step {self.request.step} did not request "
                f"(groups {sorted(self._members)} of size {self.request.groups[0].size if self.request.groups else 0}); "
                "the engine's group size or step does not match the data module's"
            )
        if isinstance(event, ContentReady):
            self._on_content(event)
            early = self._early.pop(tid, None)
            if early is not None:  # its reward came first and waited for the length
                self._dispatch(early)
        else:
            objective = self.acc.objective
            if objective.shapes_rewards:  # the overlong penalty needs the trajectory's length
                content = self.outcome.trajectories.get(tid)
                if content is None:
                    self._early[tid] = event
                    return
                event = replace(event, reward=objective.shaped_reward(event.reward, content.num_scored_tokens))
            self._on_reward(event)
            self._replace_if_uninformative(gid)
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

    def _on_reward(self, event: RewardReady) -> None:
        if event.trajectory_id in self.outcome.rewards:
            raise EngineError(f"the engine delivered the reward of {event.trajectory_id!r} twice")
        self.outcome.rewards[event.trajectory_id] = event.reward
        self.outcome.reward_times[event.trajectory_id] = event.time
        if event.failure:
            self.outcome.failures[event.trajectory_id] = event.failure
            if event.host_fault:
                self.outcome.host_faults.add(event.trajectory_id)
        if event.parts:
            self.outcome.reward_parts[event.trajectory_id] = event.parts

    def _start_stream(self, events: Iterator[RolloutEvent]) -> None:
        self._streams += 1
        pump = threading.Thread(target=_pump, args=(events, self._inbox), name="thundersync-events", daemon=True)
        pump.start()

    def _replace_if_uninformative(self, gid: str) -> None:
        """Dynamic sampling: once every verdict of ``gid`` is in, issue a replacement if it has no signal."""
        if self._issue is None or gid in self._decided:
            return
        members = self._members[gid]
        if any(t not in self.outcome.rewards for t in members):
            return
        self._decided.add(gid)
        obj = self.acc.objective
        kept = [self.outcome.rewards[t] for t in members if not (obj.failed == "drop" and t in self.outcome.host_faults)]
        if informative(kept, obj.singleton == "reward"):
            return
        self.outcome.groups_filtered += 1
        if not self._reserve:
            return
        group = self._reserve.pop(0)
        request = RolloutRequest(step=self.request.step, groups=(group,), seed=self.request.seed)
        tids = request.trajectory_ids()[group.group_id]
        self._members[group.group_id] = tids
        self._owner.update({t: group.group_id for t in tids})
        self.outcome.groups_generated += 1
        self._start_stream(self._issue(request))

    def _admit(self, gid: str) -> bool:
        limit = self.acc.max_open_groups
        if limit is not None and len(self.acc.open_groups) >= limit:
            return False
        self.acc.open_group(gid, self._members[gid])
        self._admitted.add(gid)
        self._mark_open_groups()
        return True

    def _apply(self, event: RolloutEvent) -> None:
        """Hand an admitted group's event to the accumulator (content waits for the learner)."""
        if isinstance(event, ContentReady):
            self._waiting[event.trajectory.trajectory_id] = None
            return
        start = self.clock()
        self.acc.add_reward(event.trajectory_id, event.reward, failed=event.failure is not None and event.host_fault)
        self.outcome.busy.append(Interval(start, self.clock(), "fold"))
        self._after_change()

    def _after_change(self) -> None:
        if len(self.acc.open_groups) != (self.outcome.open_groups[-1][1] if self.outcome.open_groups else -1):
            self._mark_open_groups()
            self._drain_deferred()

    def _drain_deferred(self) -> None:
        while self._deferred:
            gid = next(iter(self._deferred))
            if not self._admit(gid):
                return
            for event in self._deferred.pop(gid):
                self._apply(event)

    def _mark_open_groups(self) -> None:
        self.outcome.open_groups.append((self.clock(), len(self.acc.open_groups)))

    # ------------------------------------------------------------------ end of stream
    def _check_complete(self) -> None:
        missing = []
        for gid, members in self._members.items():
            lacking = [t for t in members if t not in self.outcome.trajectories or t not in self.outcome.rewards]
            if lacking:
                missing.append(f"{gid}: {lacking}")
        if missing:
            raise GroupError(
                f"the engine's event stream for step {self.request.step} ended before these trajectories "
                f"had both content and reward: {'; '.join(missing[:5])}. Its group size or request handling "
                "does not match the data module's."
            )

    def _report(self, final: bool) -> None:
        if self.progress is None:
            return
        now = self.clock()
        if not final and now - self._last_progress < self.progress_interval_s:
            return
        self._last_progress = now
        elapsed = now - self._start
        busy = sum(i.seconds for i in self.outcome.busy)
        self.progress(
            RolloutProgress(
                step=self.request.step,
                trajectories_total=len(self._owner),
                content_ready=len(self.outcome.trajectories),
                reward_ready=len(self.outcome.rewards),
                open_groups=len(self.acc.open_groups),
                elapsed_seconds=elapsed,
                idle_seconds=max(0.0, elapsed - busy),
            )
        )


_END = object()


def _pump(events: Iterator[RolloutEvent], inbox: queue.Queue) -> None:
    """Move events into the queue as the engine produces them; an error travels as an item."""
    try:
        for event in events:
            inbox.put(event)
    except BaseException as err:  # noqa: BLE001 - re-raised on the learner thread
        inbox.put(err)
    inbox.put(_END)


def _get_nowait(inbox: queue.Queue) -> object | None:
    try:
        return inbox.get_nowait()
    except queue.Empty:
        return None
