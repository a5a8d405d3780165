"""One RL step's work loop on one learner process.

Streaming (and async): the engine's events arrive through the :class:`~.intake.EventIntake`
(a pump thread per stream, one queue); the learner drains it and never idles while work exists.
What it backpropagates next, one learner call at a time with the queue drained in between, is
:func:`~thundersync_lightning.strategy.batching.next_batch`'s choice: fully rewarded groups'
trajectories together, else the largest (group, reward) bucket, else one reward-pending trajectory,
whose gradient is held, only when the queue is empty and fewer than ``max_held_trajectories``
gradients are held (otherwise it waits for its reward, which frees a held gradient into its group's
sum, and keeps doing reward-known work meanwhile). The learner waits only when no work is left that
fits the bounds. Sync (``defer=True``): the learner does nothing until the last event, then the
same accumulator processes the whole batch (every reward known: the direct path), so every mode
trains the same objective through the same code.

Each call is scored by the module and handed to the accumulator with
:meth:`~thundersync_lightning.core.accumulator.streaming.StreamingGRPO.add_scored`, which applies
the objective's options (the core's one scoring recipe). The accumulator answers for the step's
groups: members and owners, dropped members, informative groups
(:class:`~thundersync_lightning.core.accumulator.step_groups.StepGroups`). Dynamic sampling's
replacements: :mod:`.replacement`; the step's records: :mod:`.records`.

The runner measures what the learner did: busy intervals (scoring/backward, folds), waiting
(everything else), the open-group count over time and each trajectory's staleness.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..core.accumulator.boundary_cut import SharedPrefix
from ..core.accumulator.streaming import StreamingGRPO
from ..core.errors import ConfigError, GroupError
from ..core.grpo.terms import TokenScores
from ..core.snapshot import PolicySnapshot
from ..core.types import RolloutEvent, RolloutRequest
from .batching import Batch, count_destinations, next_batch
from .intake import EventIntake
from .records import ProgressReport, StepOutcome
from .replacement import ReplacementIssuer, Replacements
from .stats import Interval, RolloutProgress

__all__ = ["StepRunner", "StepOutcome", "RunnerSettings", "Replacements"]

ScoreFn = Callable[..., TokenScores]  # (trajectories, prefix=None[, watch=]) -> TokenScores
EncodeFn = Callable[[Sequence[int]], SharedPrefix]


@dataclass(frozen=True)
class RunnerSettings:
    """How one step's work is scheduled (none of these changes the gradient).

    Attributes:
        allowed_staleness: 0 in streaming/sync, 1 in async; a larger one raises StalenessError.
        defer: do no learner work before the event stream ends (the synchronous baseline).
        max_batch_trajectories, max_batch_tokens: the most trajectories, and the most tokens
            (``len(trajectory.tokens)``, prompt included), of one call; a trajectory longer than
            ``max_batch_tokens`` is a call of its own (None: no token bound).
        min_batch_trajectories: while the engine still has content to deliver, the learner starts
            a call only once this many trajectories (or ``max_batch_tokens`` tokens) are waiting;
            1: at once (where a call's fixed cost is large against a row's, waiting for rows
            trades a little idle learner time for less learner work).
        hold_after_s: a trajectory of a group still waiting for rewards is backpropagated (its
            gradient held, or added to its group's running sums) only once its content has waited
            this long (0: as soon as nothing else is to do). Where verdicts land within a call's
            time of their content, waiting for them turns held rows (a gradient each, then a fold)
            and partial groups' sums into direct rows (one backward for all).
        progress_interval_s: the progress listener is called at most this often (and at the end).
        clock: the time source of the busy intervals.
    """

    allowed_staleness: int = 0
    defer: bool = False
    max_batch_trajectories: int = 32
    max_batch_tokens: int | None = None
    min_batch_trajectories: int = 1
    hold_after_s: float = 0.0
    progress_interval_s: float = 0.2
    clock: Callable[[], float] = time.monotonic


class StepRunner:
    """Consumes one request's events; see the module docstring.

    Args:
        request: this rank's share of the step.
        snapshot: the policy being updated; staleness = its version - the rollout's version.
        accumulator: the step's StreamingGRPO. Its backward backend
            (:mod:`~thundersync_lightning.core.gradients.backward`) says how many destinations one call may
            span and what a call's scoring runs inside (``score`` then takes ``watch=``).
        score: the policy's per-token scores (``score_tokens`` with ``accumulator.score_needs``).
        settings: the schedule (:class:`RunnerSettings`).
        progress: called with a RolloutProgress at most every ``settings.progress_interval_s`` and at the end.
        encode: the boundary cut: a group's shared prompt is run forward once by this function
            (``encode_prefix`` of the policy) and its members are scored on it (None: no cut).
        replacements: dynamic sampling (:mod:`.replacement`); the accumulator must filter groups
            (``StreamingGRPO(filter_groups=True)``).
    """

    def __init__(
        self,
        request: RolloutRequest,
        snapshot: PolicySnapshot,
        accumulator: StreamingGRPO,
        score: ScoreFn,
        settings: RunnerSettings | None = None,
        progress: Callable[[RolloutProgress], None] | None = None,
        encode: EncodeFn | None = None,
        replacements: Replacements | None = None,
    ) -> None:
        settings = settings if settings is not None else RunnerSettings()
        if not settings.defer:
            accumulator.check_streamable()
        self.acc = accumulator
        self.score = score
        self.encode = encode
        self.defer = settings.defer
        self.clock = settings.clock
        self.max_batch = max(1, settings.max_batch_trajectories)
        self.max_tokens = settings.max_batch_tokens
        self.min_batch = max(1, min(settings.min_batch_trajectories, self.max_batch))
        self.hold_after = max(0.0, settings.hold_after_s)
        self._prefixes: dict[str, SharedPrefix] = {}
        self._entropy_threshold: float | None = None  # top_entropy_quantile: the step's (sync only)
        accumulator.plan_groups(request.trajectory_ids())
        self.outcome = StepOutcome(
            min_batch_trajectories=self.min_batch,
            max_batch_trajectories=self.max_batch,
            hold_after_s=self.hold_after,
            groups_generated=len(request.groups),
        )
        issuer = ReplacementIssuer(replacements, request, accumulator, self.outcome) if replacements else None
        self.intake = EventIntake(
            request, snapshot, settings.allowed_staleness, accumulator, self.outcome, settings.clock,
            issuer.after_verdict if issuer is not None else None,
        )  # fmt: skip
        self._progress = ProgressReport(progress, settings.progress_interval_s, request.step, settings.clock)
        self.request = request

    # ------------------------------------------------------------------ public
    def run(self, events: Iterator[RolloutEvent]) -> StepOutcome:
        self.intake.start(events)
        ended = False
        while True:
            if not ended:
                ended = self.intake.drain(block=not self._has_work(ended), timeout=self._hold_wait())
            if ended and self.acc.needs_step_entropy and self._entropy_threshold is None:
                self._entropy_threshold = self._step_entropy_threshold()
            worked = self._work(inbox_empty=self.intake.empty) if ended or not self.defer else False
            self._report(final=False)
            if ended and not worked:
                break
        self._check_complete()
        self._report(final=True)
        return self.outcome

    # ------------------------------------------------------------------ scheduling
    @property
    def _waiting(self) -> dict[str, None]:
        return self.intake.waiting

    def _has_work(self, ended: bool) -> bool:
        if not self._waiting or not (ended or not self.defer) or self._gathering():
            return False
        ripe = self._ripe()
        rewards = self.outcome.rewards
        return any(t in rewards for t in ripe) or (self._can_hold() and any(t not in rewards for t in ripe))

    def _complete(self, tid: str) -> bool:
        """Every reward of the trajectory's group is known (its row goes to the step's gradient)."""
        planned = self.acc.planned
        return all(m in self.outcome.rewards for m in planned.membership[planned.owners[tid]])

    def _ripe(self) -> list[str]:
        """The waiting trajectories the learner may take now (content order): every one whose
        group's rewards are all known, and, of a group still waiting for rewards, those whose
        content has waited ``hold_after_s`` (held rows, or rows into the group's running sums)."""
        if self.hold_after <= 0.0:
            return list(self._waiting)
        ready_before = self.clock() - self.hold_after
        content_at = self.intake.content_at
        return [t for t in self._waiting if content_at[t] <= ready_before or self._complete(t)]

    def _hold_wait(self) -> float | None:
        """Seconds until the oldest waiting trajectory of a group still waiting for rewards may be
        taken, when the learner would otherwise block with nothing to do (None: wait for the next
        event, however long)."""
        if self.hold_after <= 0.0 or self.defer or self._gathering() or self._has_work(False):
            return None
        rewards, hold = self.outcome.rewards, self._can_hold()
        landed = [self.intake.content_at[t] for t in self._waiting if t in rewards or hold]
        if not landed:
            return None
        return max(0.0, min(landed) + self.hold_after - self.clock())

    def _gathering(self) -> bool:
        """Wait for more content before the next call: fewer than ``min_batch_trajectories`` (and,
        with a token cap, fewer than ``max_batch_tokens`` tokens) are waiting while the engine has
        content still to deliver and no group is deferred (a deferred group is admitted only
        after the learner's work closes an open one, so waiting then could only stall)."""
        if self.min_batch <= 1 or len(self._waiting) >= self.min_batch or self.intake.has_deferred:
            return False
        if len(self.outcome.trajectories) >= self.acc.planned.num_trajectories:
            return False
        return self.max_tokens is None or sum(self._lengths_of(self._waiting).values()) < self.max_tokens

    def _can_hold(self) -> bool:
        """Room to backpropagate one more reward-pending trajectory (its gradient is held)."""
        limit = self.acc.max_held_trajectories
        return limit is None or self.acc.held_trajectories < limit

    def _work(self, inbox_empty: bool) -> bool:
        """One unit of learner work; False when there was none."""
        planned = self.acc.planned
        dropped = [t for t in self._waiting if planned.is_dropped(t)]
        for t in dropped:  # a failed verdict under failed="drop": never scored
            del self._waiting[t]
        if self._gathering():
            return bool(dropped)
        ripe = self._ripe()
        batch = next_batch(
            ripe,
            self.outcome.rewards,
            planned.owners,
            planned.membership,
            self.max_batch,
            hold=self._room_to_hold() if inbox_empty else 0,
            destinations=self.acc.backend.destinations,
            lengths=self._lengths_of(ripe) if self.max_tokens is not None else None,
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

    # ------------------------------------------------------------------ learner calls
    def _backward(self, batch: Batch) -> None:
        tids = batch.trajectories
        start = self.clock()
        if self.encode is None:
            self._score_and_add(tids, None)
        else:
            by_group: dict[str, list[str]] = {}
            for t in tids:
                by_group.setdefault(self.acc.planned.owners[t], []).append(t)
            for gid, members in by_group.items():
                self._score_and_add(members, self._prefix_of(gid, members[0]))
            self._prefixes = {g: p for g, p in self._prefixes.items() if g in self.acc.open_groups}
        for t in tids:
            del self._waiting[t]
        tokens = sum(self._lengths_of(tids).values())
        self.outcome.busy.append(Interval(start, self.clock(), "backward", len(tids), batch.path, tokens))
        self.intake.after_change()

    def _score_and_add(self, tids: list[str], prefix: SharedPrefix | None) -> None:
        planned = self.acc.planned
        trajectories = [self.outcome.trajectories[t] for t in tids]
        rewards = self.outcome.rewards
        watch = self.acc.backend.watch(count_destinations(tids, rewards, planned.owners, planned.membership))
        extra = {"watch": watch} if watch is not None else {}
        scores = self.score(trajectories, prefix=prefix, **extra)
        self.acc.add_scored(
            trajectories, scores, entropy_threshold=self._entropy_threshold, prefix=prefix, watch=watch
        )
        cut = len(prefix.tokens) if prefix is not None else 0
        self.outcome.learner_tokens += sum(len(t.tokens) - cut for t in trajectories)

    def _step_entropy_threshold(self) -> float | None:
        """``top_entropy_quantile``: one no-grad forward of every kept trajectory of the step, then the
        quantile of every scored token's entropy over all ranks (TRL gathers them too)."""
        tids = [t for t in self.outcome.trajectories if not self.acc.planned.is_dropped(t)]
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
        return self.acc.step_entropy_threshold(gathered)

    def _prefix_of(self, gid: str, tid: str) -> SharedPrefix:
        """The group's shared prompt, run forward once when its first member is scored."""
        prefix = self._prefixes.get(gid)
        if prefix is None:
            assert self.encode is not None
            prompt = self.outcome.trajectories[tid].prompt
            prefix = self._prefixes[gid] = self.encode(prompt)
            self.outcome.learner_tokens += len(prompt)
        return prefix

    # ------------------------------------------------------------------ end of stream
    def _check_complete(self) -> None:
        missing = []
        for gid, members in self.acc.planned.membership.items():
            lacking = [
                t for t in members if t not in self.outcome.trajectories or t not in self.outcome.rewards
            ]
            if lacking:
                missing.append(f"{gid}: {lacking}")
        if missing:
            raise GroupError(
                f"the engine's event stream for step {self.request.step} ended before these trajectories "
                f"had both content and reward: {'; '.join(missing[:5])}. Its group size or request handling "
                "does not match the data module's."
            )

    def _report(self, final: bool) -> None:
        self._progress(self.outcome, self.acc.planned.num_trajectories, len(self.acc.open_groups), final)
