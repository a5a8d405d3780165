"""The multi-turn agent loop, independent of how tokens are generated.

An episode is: ``prompt = env.reset()``; then per turn the policy acts (generates up to ``max_action_tokens``
tokens, stopping after ``stop_token``; without it: ``truncated_actions``), the environment answers
``env.step(action) -> StepResult(observation, done)`` and the observation is appended as an unscored segment;
until ``done`` ("submit") or ``max_turns`` ("turn_limit"). A step's tool-call counts
(``StepResult.tool_calls`` / ``invalid_tool_calls``, see ``envs/tools``) add up into the trajectory's. Then
the episode's tokens are final (:class:`ContentReady`) and its verdict runs in the pool, once no episode of
its task acts, in any group or request of this loop; an episode's first action likewise waits until no
verdict of its task is held or running (:mod:`.group_gate`: no acting episode can observe a grading run of
its task); the verdict yields :class:`RewardReady` later, from a pool thread.

An engine supplies only a :data:`GenerateFn`: "continue these token prefixes, each with its own
seed", batched. The loop schedules at turn granularity: whichever episodes are waiting for the
policy are generated together, while the others wait for their environment. Turn ``k`` of the
trajectory with seed ``s`` samples with seed ``turn_seed(s, k)``, so its tokens depend only on
(seed, step, group, sample) and the weights, never on batch composition or completion order.

Preparing ahead (:meth:`AgentLoop.prepare`, the engines' ``PreparesAhead.prepare``): the reset
wave of a request (``make_env``, ``env.reset``: sandboxes, workspaces, prompt tokens) needs no
weights, so it can start before the request's weights exist. ``prepare(request)`` submits it to
the pool at once and keeps each episode, with its reset future, keyed by (trajectory id,
trajectory seed); ``run`` claims the prepared episodes of its request (waiting on a reset still
running) and creates the others itself. The episode, its reset call and its timeout are the ones
``run`` would have made, so the events are the same with or without ``prepare`` (same tokens,
rewards and failure reasons; only their times differ): a reset that fails or times out while
prepared ends the trajectory as ``"failure"`` with the same reason, when it is rolled out.
Prepared episodes of an older step than a request being run are closed then (nothing will claim
them); :meth:`AgentLoop.close_prepared` closes the rest at shutdown, so no sandbox leaks.

If generation itself raises, ``run`` re-raises after closing every environment whose episode had
not finished (including those whose reset/step is still running, once it returns).

Failures of the environment never escape: an environment call that raises or times out ends
the episode with ``finish_reason="failure"`` (tokens so far are still delivered) and
``RewardReady(reward=0.0, failure=...)``; a verdict that raises, times out or is not a finite
number gives reward 0.0 with the reason. Only a failure no action of the episode can have caused
is marked ``host_fault`` (and may leave its group under ``failed="drop"``): a reset that fails
(nothing has acted yet) or a call that raised :class:`~...core.errors.HostFault`. A failed episode's
environment is closed at once, on a thread of its own (never queued behind a saturated pool), so
no further command of the ended episode starts. An observation that would carry the context past
``max_context_tokens`` is cut to fit, and the episode ends with ``finish_reason="length"``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field, replace
from typing import Any

from ...core.protocols import STEP_TIMEOUT_S, VERDICT_TIMEOUT_S, Environment, TaskSource
from ...core.types import (
    ContentReady,
    RewardReady,
    RolloutEvent,
    RolloutRequest,
    Segment,
    StepResult,
    Trajectory,
    derive_seed,
    trajectory_id,
)
from ..sampling import turn_seed
from .env_pool import EnvPool, Outcome, run_detached
from .generation import GenerateFn, Generation, GenerationRequest
from .group_gate import VerdictGate, task_key
from .verdict import Verdict, check_verdict, read_verdict

__all__ = ["GenerationRequest", "Generation", "GenerateFn", "AgentLoop", "check_verdict"]


def _after(reset: Future[Outcome[Any]], admitted: Future[None]) -> Future[Outcome[Any]]:
    """A future with ``reset``'s outcome, done once ``reset`` is done and ``admitted`` is set (never
    when ``admitted`` is cancelled: the run that waited for it has ended)."""
    joined: Future[Outcome[Any]] = Future()

    def on_reset(f: Future[Outcome[Any]]) -> None:
        admitted.add_done_callback(lambda a: None if a.cancelled() else joined.set_result(f.result()))

    reset.add_done_callback(on_reset)
    return joined


def _same_task(prepared: _Episode, wanted: _Episode) -> bool:
    """Whether a prepared episode is the one ``wanted`` names (a task that cannot be compared: no)."""
    if (prepared.group_id, prepared.sample) != (wanted.group_id, wanted.sample):
        return False
    try:
        return prepared.task is wanted.task or bool(prepared.task == wanted.task)
    except Exception:  # e.g. array fields: ambiguous truth value
        return False


@dataclass(slots=True)
class _Episode:
    sample: int
    group_id: str
    trajectory_id: str
    seed: int
    task: Any
    env: Environment | None = None
    prompt: tuple[int, ...] = ()
    segments: list[Segment] = field(default_factory=list)
    context: list[int] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    invalid_tool_calls: int = 0
    tool_errors: int = 0  # calls whose tool reported a failure; tool_timeouts of them past the deadline
    tool_timeouts: int = 0
    tool_error: str | None = None
    gate_key: Any = None


class AgentLoop:
    """Runs the episodes of a :class:`RolloutRequest` with a given generator.

    Args:
        tasks: the task source (turn limit, action budget, stop token, environments).
        generate: the engine's batched generation callable.
        pool: where environment calls run.
        step_timeout_s: limit for one ``reset`` or ``step`` call.
        verdict_timeout_s: limit for one ``verdict`` call.
        max_batch_size: most episodes per ``generate`` call (None: no limit).
        max_context_tokens: an episode whose context would exceed this ends with
            ``finish_reason="length"`` (None: no limit).
        coalesce_s: after the first environment call of a wave returns, wait at most this long
            for the others so that they are generated as one batch (0: generate at once).
        annotate: called on each finished trajectory before its ContentReady; returns the
            trajectory to deliver (e.g. with teacher logprobs, see :mod:`.teacher`).
    """

    def __init__(
        self,
        tasks: TaskSource,
        generate: GenerateFn,
        pool: EnvPool,
        *,
        step_timeout_s: float | None = STEP_TIMEOUT_S,
        verdict_timeout_s: float | None = VERDICT_TIMEOUT_S,
        max_batch_size: int | None = None,
        max_context_tokens: int | None = None,
        coalesce_s: float = 0.002,
        annotate: Callable[[Trajectory], Trajectory] | None = None,
    ) -> None:
        self.tasks = tasks
        self.annotate = annotate
        self.coalesce_s = coalesce_s
        self.generate = generate
        self.pool = pool
        self.step_timeout_s = step_timeout_s
        self.verdict_timeout_s = verdict_timeout_s
        self.max_batch_size = max_batch_size
        self.max_context_tokens = max_context_tokens
        self._prepared_lock = threading.Lock()  # prepare (any thread) against run and close_prepared
        self._prepared: dict[tuple[str, int], tuple[int, _Episode, Future[Outcome[Any]]]] = {}
        self._prepare_closed = False
        self._gate = VerdictGate()  # across run() calls: a task's verdicts wait for all its acting episodes

    def prepare(self, request: RolloutRequest) -> None:
        """Start the reset wave of ``request`` (``make_env`` and ``env.reset``) in the pool; return at once.

        Thread-safe, and safe to call while ``run`` is generating another request. A trajectory
        already prepared is not prepared twice; after :meth:`close_prepared` this does nothing.
        """
        with self._prepared_lock:
            if self._prepare_closed:
                return
            for ep in self._episodes(request):
                key = (ep.trajectory_id, ep.seed)
                if key not in self._prepared:
                    # priority 1: behind every call of the request being generated now
                    future = self.pool.submit(self._resetter(ep), self.step_timeout_s, "reset", priority=1)
                    self._prepared[key] = (request.step, ep, future)

    def close_prepared(self, timeout_s: float | None = None) -> int:
        """Close every prepared episode no ``run`` claimed; return how many environments were closed.

        Resets still queued are cancelled (nothing was created); the environments of finished ones
        are closed in the pool. Waits at most ``timeout_s`` in all (default: ``step_timeout_s``)
        for running resets and for the closes; an environment whose reset returns later is closed
        then, if the pool still runs. Later ``prepare`` calls do nothing: call it when the engine
        shuts down, before shutting the pool down.
        """
        with self._prepared_lock:
            self._prepare_closed = True
            entries = [(ep, future) for _, ep, future in self._prepared.values()]
            self._prepared.clear()
        return self._discard(entries, self.step_timeout_s if timeout_s is None else timeout_s)

    def _claim(self, request: RolloutRequest) -> list[tuple[_Episode, Future[Outcome[Any]] | None]]:
        """``request``'s episodes, each with its prepared reset (None: not prepared)."""
        claimed: list[tuple[_Episode, Future[Outcome[Any]] | None]] = []
        with self._prepared_lock:
            for ep in self._episodes(request):
                entry = self._prepared.pop((ep.trajectory_id, ep.seed), None)
                if entry is not None and not _same_task(entry[1], ep):  # another task under this id
                    self._prepared[(ep.trajectory_id, ep.seed)] = entry
                    entry = None
                claimed.append((ep, None) if entry is None else (entry[1], entry[2]))
            stale = [key for key, (step, _, _) in self._prepared.items() if step < request.step]
            old = [self._prepared.pop(key)[1:] for key in stale]
        if old:  # an older step than the one running now: no run will claim them
            threading.Thread(target=self._discard, args=(old, self.step_timeout_s), daemon=True).start()
        return claimed

    def _discard(self, entries: list[tuple[_Episode, Future[Outcome[Any]]]], timeout_s: float | None) -> int:
        """Close the environments of ``entries`` (prepared episodes nobody will run)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        started = [(ep, future) for ep, future in entries if not future.cancel()]  # queued: nothing created
        wait([future for _, future in started], timeout=timeout_s)
        closes = []
        for ep, future in started:
            if future.done():
                env, ep.env = ep.env, None
                if env is not None:
                    closes.append(self.pool.submit(env.close, self.step_timeout_s, "close"))
            else:  # still creating past the wait: close it when it returns (if the process lives on)
                future.add_done_callback(lambda _f, ep=ep: self._close(ep))
        wait(closes, timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        return len(closes)

    def run(
        self,
        request: RolloutRequest,
        version: int,
        emit: Callable[[RolloutEvent], None],
        clock: Callable[[], float] = time.monotonic,
        submitted_at: float | None = None,
    ) -> threading.Event:
        """Generate every episode of ``request`` with weights ``version``; return when all are final.

        ``emit`` receives every ContentReady (from this thread) and RewardReady (from pool
        threads, possibly after ``run`` returned); it must be thread-safe. ``submitted_at``
        (default: now) is when the learner issued the request, on the same ``clock``.

        Returns an event that is set once every RewardReady of the request has been emitted.
        """
        submitted = clock() if submitted_at is None else submitted_at
        all_rewarded = threading.Event()
        outstanding = [request.num_trajectories]
        count_lock = threading.Lock()
        emit_content = emit

        def emit_reward(event: RolloutEvent) -> None:
            emit_content(event)
            with count_lock:
                outstanding[0] -= 1
                if outstanding[0] == 0:
                    all_rewarded.set()

        if request.num_trajectories == 0:
            all_rewarded.set()
        episodes = self._claim(request)
        gate = self._gate
        pending: dict[Future[Outcome[Any]], _Episode] = {}
        admissions: dict[str, Future[None]] = {}
        resets: dict[str, Future[Outcome[Any]]] = {}
        for ep, prepared in episodes:
            resets[ep.trajectory_id] = future = prepared or self.pool.submit(
                self._resetter(ep), self.step_timeout_s, "reset"
            )
            # The reset runs no model output; the first action waits until no verdict of the task is pending.
            admissions[ep.trajectory_id] = admitted = gate.admit(ep.gate_key)
            pending[_after(future, admitted)] = ep
        ready: list[_Episode] = []
        live = {ep.trajectory_id: ep for ep, _ in episodes}  # episodes whose content is not final yet

        def stopped(ep: _Episode, closing: Future[Outcome[Any]] | None) -> None:
            """``ep`` stops acting once ``closing`` (its close, if any) has returned."""
            if closing is None:
                gate.stop(ep.gate_key)
            else:
                closing.add_done_callback(lambda _f: gate.stop(ep.gate_key))

        def finish(ep: _Episode, reason: str, failure: str | None = None, host_fault: bool = False) -> None:
            del live[ep.trajectory_id]
            traj = Trajectory(
                trajectory_id=ep.trajectory_id,
                group_id=ep.group_id,
                sample=ep.sample,
                prompt=ep.prompt,
                segments=tuple(ep.segments),
                policy_version=version,
                num_turns=ep.turns,
                finish_reason=reason,
                submitted_at=submitted,
                content_ready_at=clock(),
                failure=failure,
                tool_calls=ep.tool_calls,
                invalid_tool_calls=ep.invalid_tool_calls,
                tool_errors=ep.tool_errors,
                tool_timeouts=ep.tool_timeouts,
                tool_error=ep.tool_error,
                truncated_actions=sum(  # budget-ended
                    self.tasks.stop_token not in (None, *seg.tokens) for seg in ep.segments if seg.scored
                ),
            )
            if self.annotate is not None:  # its time counts: content is ready once annotated
                traj = replace(self.annotate(traj), content_ready_at=clock())
            emit_content(ContentReady(traj, traj.content_ready_at))
            if failure is not None:
                stopped(
                    ep, self._close(ep, at_once=True)
                )  # a call may still run past its timeout: close kills it
                emit_reward(RewardReady(ep.trajectory_id, ep.group_id, 0.0, clock(), failure, host_fault))
            else:
                gate.hold(ep.gate_key, lambda: self._start_verdict(ep, emit_reward, clock))
                stopped(ep, None)

        def absorb(done: set[Future[Outcome[Any]]]) -> None:
            for fut in done:
                ep = pending.pop(fut)
                outcome = fut.result()
                if not outcome.ok:  # a reset failed before any action: the episode cannot have caused it
                    finish(ep, "failure", outcome.failure, outcome.host_fault or ep.turns == 0)
                elif isinstance(outcome.value, StepResult):
                    obs, is_done = outcome.value.observation, outcome.value.done
                    ep.tool_calls += outcome.value.tool_calls
                    ep.invalid_tool_calls += outcome.value.invalid_tool_calls
                    ep.tool_errors += outcome.value.tool_errors
                    ep.tool_timeouts += outcome.value.tool_timeouts
                    ep.tool_error = ep.tool_error or outcome.value.tool_error
                    room = (
                        None if self.max_context_tokens is None else self.max_context_tokens - len(ep.context)
                    )
                    if room is not None and len(obs) > room:  # the last observation, cut to the context
                        obs = tuple(obs[: max(0, room)])
                    if obs:
                        ep.segments.append(Segment(obs, scored=False))
                        ep.context.extend(obs)
                    if is_done:
                        finish(ep, "submit")
                    elif ep.turns >= self.tasks.max_turns:
                        finish(ep, "turn_limit")
                    else:
                        self._enqueue(ep, ready, finish)
                else:  # reset done
                    self._enqueue(ep, ready, finish)

        try:
            while pending or ready:
                if not ready:
                    wait(list(pending), return_when=FIRST_COMPLETED)
                    if self.coalesce_s > 0:  # let the environment calls finishing together form one batch
                        wait(list(pending), timeout=self.coalesce_s)
                    absorb({f for f in pending if f.done()})
                    continue
                batch = ready[: self.max_batch_size] if self.max_batch_size else list(ready)
                del ready[: len(batch)]
                outputs = self.generate([self._gen_request(ep) for ep in batch])
                if len(outputs) != len(batch):
                    raise RuntimeError(f"generate returned {len(outputs)} outputs for {len(batch)} requests")
                for ep, out in zip(batch, outputs):
                    ep.turns += 1
                    ep.segments.append(Segment(tuple(out.tokens), scored=True, logprobs=tuple(out.logprobs)))
                    ep.context.extend(out.tokens)
                    action = tuple(out.tokens)
                    pending[self.pool.submit(self._stepper(ep, action), self.step_timeout_s, "step")] = ep
                absorb({f for f in pending if f.done()})
        except BaseException:  # generation failed: no unfinished environment (sandbox) may leak
            for fut, ep in pending.items():
                fut.add_done_callback(lambda _f, ep=ep: self._close(ep))
            for ep in live.values():  # held verdicts of their groups start once these closes returned
                if gate.withdraw(ep.gate_key, admissions[ep.trajectory_id]):
                    stopped(ep, self._close(ep))
                else:  # never admitted, so it never acted: close it once its reset has returned
                    admissions[ep.trajectory_id].cancel()
                    resets[ep.trajectory_id].add_done_callback(lambda _f, ep=ep: self._close(ep))
            raise
        return all_rewarded

    # -- pieces -----------------------------------------------------------------------------

    @staticmethod
    def _episodes(request: RolloutRequest) -> list[_Episode]:
        return [
            _Episode(
                sample=k,
                group_id=g.group_id,
                trajectory_id=trajectory_id(request.step, g.group_index, k),
                seed=derive_seed(request.seed, request.step, g.group_index, k),
                task=g.task,
                gate_key=task_key(g.task),
            )
            for g in request.groups
            for k in range(g.size)
        ]

    def _resetter(self, ep: _Episode) -> Callable[[], None]:
        def reset() -> None:
            ep.env = self.tasks.make_env(ep.task, ep.seed)
            prompt = tuple(int(t) for t in ep.env.reset())
            ep.prompt = prompt
            ep.context = list(prompt)

        return reset

    @staticmethod
    def _stepper(ep: _Episode, action: tuple[int, ...]) -> Callable[[], StepResult]:
        def step() -> StepResult:
            assert ep.env is not None
            result = ep.env.step(action)
            if not isinstance(result, StepResult):
                raise TypeError(f"Environment.step returned {type(result).__name__}, expected StepResult")
            return result

        return step

    def _enqueue(self, ep: _Episode, ready: list[_Episode], finish: Callable[..., None]) -> None:
        budget = self.max_context_tokens
        if budget is not None and len(ep.context) + self.tasks.max_action_tokens > budget:
            finish(ep, "length")
        else:
            ready.append(ep)

    def _gen_request(self, ep: _Episode) -> GenerationRequest:
        return GenerationRequest(
            prefix=tuple(ep.context),
            seed=turn_seed(ep.seed, ep.turns),
            max_new_tokens=self.tasks.max_action_tokens,
            stop_token=self.tasks.stop_token,
        )

    def _start_verdict(
        self, ep: _Episode, emit: Callable[[RolloutEvent], None], clock: Callable[[], float]
    ) -> None:
        """Run ``ep``'s verdict in the pool; once it and the environment's close have returned, the
        gate admits the episodes of its task that wait (``VerdictGate.finished``)."""
        env = ep.env
        assert env is not None
        gate = self._gate
        try:
            fut = self.pool.submit(env.verdict, self.verdict_timeout_s, "verdict")
        except BaseException:
            gate.finished(ep.gate_key)
            raise
        once = threading.Lock()

        def on_done(f: Future[Outcome[Any]]) -> None:
            if not once.acquire(blocking=False):
                return
            try:
                outcome = f.result()
                verdict = (
                    read_verdict(outcome.value) if outcome.ok else Verdict(0.0, outcome.failure, (), False)
                )
                emit(
                    RewardReady(
                        ep.trajectory_id,
                        ep.group_id,
                        verdict.reward,
                        clock(),
                        verdict.failure,
                        outcome.host_fault,
                        verdict.parts,
                        verdict.unscorable,
                    )
                )
            finally:
                # Also after a timeout: close() is how an environment frees a stuck run, so the
                # verdict ends only once it has returned.
                closing = self._close(ep)
                if closing is None:
                    gate.finished(ep.gate_key)
                else:
                    closing.add_done_callback(lambda _f: gate.finished(ep.gate_key))

        fut.add_done_callback(on_done)

    def _close(self, ep: _Episode, at_once: bool = False) -> Future[Outcome[Any]] | None:
        """Close ``ep``'s environment (once) in the pool, or ``at_once`` on a thread of its own (a
        failed episode: its close, which stops its sandbox's runs, must not queue behind the calls
        that overran); the close's future, or None if there was none."""
        env = ep.env
        if env is None:
            return None
        ep.env = None
        if at_once:
            return run_detached(env.close, "close")
        return self.pool.submit(env.close, self.step_timeout_s, "close")
