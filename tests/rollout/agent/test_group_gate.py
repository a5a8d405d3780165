"""A task's verdicts start only once every episode of that task, in any group or request, has
stopped acting; episodes of other tasks act beside them."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from thundersync_lightning.core.types import ContentReady, RewardReady, StepResult, derive_seed
from thundersync_lightning.rollout import AgentLoop, EnvPool, Generation, GenerationRequest, make_request
from thundersync_lightning.rollout.agent.group_gate import VerdictGate, task_key

WAIT_S = 60.0  # only against a hang: every wait below is released by an event of the run itself


@dataclass(frozen=True, slots=True)
class Plan:
    """Per sample of the group: how many steps before submitting ("raise@k": the k-th step raises)."""

    samples: tuple[str, ...]


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acting: dict[str, bool] = {}  # trajectory id -> still acting
        self.violations: list[str] = []
        self.cross_group: list[str] = []  # verdicts that ran while another group's episode acted
        self.other_group_verdict = threading.Event()
        self.closed: set[str] = set()
        self.closed_cv = threading.Condition(self.lock)


class GateEnv:
    def __init__(self, tid: str, behaviour: str, rec: Recorder) -> None:
        self.tid, self.behaviour, self.rec, self.turn = tid, behaviour, rec, 0
        self.group = tid.rsplit("-t", 1)[0]

    def reset(self) -> tuple[int, ...]:
        with self.rec.lock:
            self.rec.acting[self.tid] = True
        return (0,)

    def step(self, action: Sequence[int]) -> StepResult:
        self.turn += 1
        if self.turn == 2 and self.group == "s0-g0":  # act on while group 1's verdicts run
            assert self.rec.other_group_verdict.wait(WAIT_S)
        if self.behaviour == f"raise@{self.turn}":
            raise RuntimeError("tool crashed")
        done = self.turn >= int(self.behaviour) if self.behaviour.isdigit() else False
        if done:
            with self.rec.lock:
                self.rec.acting[self.tid] = False
        return StepResult((1,), done)

    def verdict(self) -> float:
        with self.rec.lock:
            siblings = [t for t, a in self.rec.acting.items() if a and t.startswith(self.group + "-")]
            others = [t for t, a in self.rec.acting.items() if a and not t.startswith(self.group + "-")]
            if siblings:
                self.rec.violations.append(f"{self.tid} graded while {siblings} acted")
            if others:
                self.rec.cross_group.append(self.tid)
        if self.group != "s0-g0":
            self.rec.other_group_verdict.set()
        return 1.0

    def close(self) -> None:
        with self.rec.lock:
            self.rec.acting[self.tid] = False
            self.rec.closed.add(self.tid)
            self.rec.closed_cv.notify_all()


class GateTasks:
    max_turns, max_action_tokens, stop_token = 8, 1, None

    def __init__(self, plans: list[Plan], rec: Recorder, seed: int = 3) -> None:
        self.plans, self.rec = plans, rec
        self.behaviour = {
            derive_seed(seed, 0, g, k): (f"s0-g{g}-t{k}", b)
            for g, plan in enumerate(plans)
            for k, b in enumerate(plan.samples)
        }

    def tasks(self, step: int, num_groups: int, seed: int) -> list[Plan]:
        return self.plans[:num_groups]

    def make_env(self, task: Plan, seed: int) -> GateEnv:
        tid, behaviour = self.behaviour[seed]
        return GateEnv(tid, behaviour, self.rec)


def one_token(requests: Sequence[GenerationRequest]) -> list[Generation]:
    return [Generation((1,), (0.0,)) for _ in requests]


@pytest.fixture
def pool():
    p = EnvPool(8)
    yield p
    p.shutdown()


def run(plans: list[Plan], pool: EnvPool, generate=one_token) -> tuple[Recorder, list]:
    rec = Recorder()
    tasks = GateTasks(plans, rec)
    request = make_request(tasks, step=0, num_groups=len(plans), group_size=len(plans[0].samples), seed=3)
    events: list = []
    lock = threading.Lock()

    def emit(event) -> None:
        with lock:
            events.append(event)

    done = AgentLoop(tasks, generate, pool, coalesce_s=0.0).run(request, 0, emit)
    assert done.wait(WAIT_S)
    return rec, events


def test_a_verdict_waits_for_its_acting_siblings_but_not_for_other_groups(pool):
    # Group 0: one episode submits after 1 step, its sibling acts for 3 (its 2nd step runs only once
    # a verdict of group 1 has started). Before: group 0's first verdict ran beside the acting sibling.
    rec, events = run([Plan(("1", "3")), Plan(("1", "1"))], pool)
    assert rec.violations == []
    assert set(rec.cross_group) >= {"s0-g1-t0", "s0-g1-t1"}  # the gate is per group
    rewards = {e.trajectory_id: e.reward for e in events if isinstance(e, RewardReady)}
    assert rewards == {"s0-g0-t0": 1.0, "s0-g0-t1": 1.0, "s0-g1-t0": 1.0, "s0-g1-t1": 1.0}


def test_a_sibling_that_fails_stops_acting_only_once_it_is_closed(pool):
    rec, events = run([Plan(("1", "raise@2")), Plan(("1", "1"))], pool)
    assert rec.violations == []
    failed = [e for e in events if isinstance(e, RewardReady) and e.trajectory_id == "s0-g0-t1"]
    assert failed[0].failure and "tool crashed" in failed[0].failure
    assert "s0-g0-t1" in rec.closed


def test_when_generation_fails_held_verdicts_run_after_the_siblings_were_closed(pool):
    calls = []

    def fails_second_wave(requests):
        calls.append(len(requests))
        if len(calls) == 2:
            raise RuntimeError("engine died")
        return one_token(requests)

    rec = Recorder()
    rec.other_group_verdict.set()  # one group only
    tasks = GateTasks([Plan(("1", "3"))], rec)
    request = make_request(tasks, step=0, num_groups=1, group_size=2, seed=3)
    events: list = []
    with pytest.raises(RuntimeError, match="engine died"):
        AgentLoop(tasks, fails_second_wave, pool, coalesce_s=0.0).run(request, 0, events.append)
    with rec.closed_cv:  # the held verdict and the closes run in the pool after run() raised
        assert rec.closed_cv.wait_for(lambda: {"s0-g0-t0", "s0-g0-t1"} <= rec.closed, WAIT_S)
    assert rec.violations == []
    assert [e.reward for e in events if isinstance(e, RewardReady)] == [1.0]


def test_the_gate_releases_held_starts_only_when_the_last_episode_of_their_key_stops():
    gate, started = VerdictGate(), []
    gate.enter("a")
    gate.enter("a")
    gate.enter("b")
    gate.hold("a", lambda: started.append("a1"))
    gate.stop("a")
    gate.stop("b")  # another task: releases nothing of "a"
    assert started == []
    gate.hold("a", lambda: started.append("a2"))
    gate.stop("a")
    assert started == ["a1", "a2"]
    gate.hold("a", lambda: started.append("a3"))  # nobody acts: at once
    assert started == ["a1", "a2", "a3"]
    with pytest.raises(RuntimeError, match="more often"):
        gate.stop("a")
    assert task_key(Plan(("1",))) == task_key(Plan(("1",))) != task_key(Plan(("2",)))
    assert task_key({"instance_id": "x"}) == task_key({"instance_id": "x"})  # unhashable rows too


class SameTask:
    """Every group draws the same task; the ``long`` episodes act for ``turns`` steps (their first
    waits until ``go`` is set: by a verdict, or by the test once the short episodes' content is in),
    the others submit at once. Records verdicts that ran while an episode of the task acted."""

    max_turns, max_action_tokens, stop_token = 8, 1, None

    def __init__(self, turns: int) -> None:
        self.turns, self.rec, self.go = turns, Recorder(), threading.Event()

    def tasks(self, step: int, num_groups: int, seed: int) -> list[str]:
        return ["the-task"] * num_groups

    def make_env(self, task: str, seed: int) -> SameTaskEnv:
        return SameTaskEnv(self, seed)


class SameTaskEnv:
    def __init__(self, src: SameTask, seed: int) -> None:
        self.src, self.key, self.turn = src, seed, 0

    def reset(self) -> tuple[int, ...]:
        with self.src.rec.lock:
            self.src.rec.acting[str(self.key)] = True
        return (0,)

    def step(self, action: Sequence[int]) -> StepResult:
        self.turn += 1
        long = self.key in self.src.long
        if long and self.turn == 1:
            assert self.src.go.wait(WAIT_S)
        done = not long or self.turn >= self.src.turns
        if done:
            with self.src.rec.lock:
                self.src.rec.acting[str(self.key)] = False
        return StepResult((1,), done)

    def verdict(self) -> float:
        with self.src.rec.lock:
            acting = [t for t, a in self.src.rec.acting.items() if a]
            if acting:
                self.src.rec.violations.append(f"verdict while {acting} acted")
        self.src.go.set()
        return 1.0

    def close(self) -> None:
        pass


@pytest.mark.parametrize("across", ["groups", "steps"])
def test_no_verdict_of_a_task_runs_while_an_episode_of_that_task_acts_in_another_group_or_step(pool, across):
    # Before: the gate was per group, so group 1 (or step 1) was graded while step 0's group 0 acted.
    src = SameTask(turns=3)
    loop = AgentLoop(src, one_token, pool, coalesce_s=0.0)
    if across == "groups":
        request = make_request(src, step=0, num_groups=2, group_size=2, seed=3)
        src.long = {derive_seed(3, 0, 0, k) for k in range(2)}  # group 0 acts long, group 1 submits at once
        runs = [(request, 0)]
    else:
        src.long = {derive_seed(3, 0, 0, k) for k in range(2)}  # step 0 acts long, step 1 submits at once
        runs = [
            (make_request(src, step=0, num_groups=1, group_size=2, seed=3), 0),
            (make_request(src, step=1, num_groups=1, group_size=2, seed=3), 1),
        ]
    events: list = []
    lock = threading.Lock()
    short_done = threading.Semaphore(0)

    def emit(event) -> None:
        with lock:
            events.append(event)
        if isinstance(event, ContentReady) and event.trajectory.num_turns == 1:
            short_done.release()

    done: list = []
    threads = [threading.Thread(target=lambda r=r, v=v: done.append(loop.run(r, v, emit))) for r, v in runs]
    for t in threads:
        t.start()
    for _ in range(2):  # the short episodes are final; their verdicts now wait for the long ones
        assert short_done.acquire(timeout=WAIT_S)
    src.go.set()
    for t in threads:
        t.join(WAIT_S)
    assert len(done) == len(runs) and all(d.wait(WAIT_S) for d in done)
    assert src.rec.violations == []
    assert sum(isinstance(e, RewardReady) for e in events) == 4


# ---------------------------------------------------------------- episodes wait for running verdicts


def test_a_new_episode_of_a_task_is_admitted_only_once_no_verdict_of_it_is_pending():
    gate = VerdictGate()
    started = []
    first = gate.admit("a")
    assert first.done() and gate.acting("a") == 1
    gate.hold("a", lambda: started.append("v1"))  # held: an episode of "a" acts
    second = gate.admit("a")  # a held verdict makes new episodes wait too (no starvation)
    other = gate.admit("b")
    assert not second.done() and other.done() and gate.acting("a") == 1
    gate.stop("a")
    assert started == ["v1"] and not second.done()  # the verdict runs; the new episode still waits
    gate.finished("a")
    assert second.done() and gate.acting("a") == 1 and gate.pending_verdicts("a") == 0
    gate.hold("a", lambda: started.append("v2"))
    third = gate.admit("a")
    assert not gate.withdraw("a", third)  # it never acted: forgotten, nothing to stop
    assert gate.withdraw("a", second)  # admitted: it acts until stopped
    gate.stop("a")
    gate.finished("a")
    assert started == ["v1", "v2"] and not third.done() and gate.acting("a") == 0
    with pytest.raises(RuntimeError, match="more often"):
        gate.finished("a")


class AcrossSteps:
    """Step 0 draws task "T"; step 1 draws "T" and "U". T's verdict of step 0 runs until U's episode
    of step 1 has submitted (after ``u_turns`` steps); any step of a T episode while a T verdict
    runs is recorded. Before: step 1's T episode acted at once, beside the running verdict."""

    max_turns, max_action_tokens, stop_token = 8, 1, None

    def __init__(self, u_turns: int = 3) -> None:
        self.u_turns, self.lock = u_turns, threading.Lock()
        self.verdicts_running = 0
        self.violations: list[str] = []
        self.u_done = threading.Event()
        self.steps: list[str] = []
        self.closed = 0
        self.closed_cv = threading.Condition(self.lock)

    def tasks(self, step: int, num_groups: int, seed: int) -> list[str]:
        return ["T", "U"][:num_groups] if step else ["T"]

    def make_env(self, task: str, seed: int) -> AcrossStepsEnv:
        return AcrossStepsEnv(self, task)


class AcrossStepsEnv:
    def __init__(self, src: AcrossSteps, task: str) -> None:
        self.src, self.task, self.turn = src, task, 0

    def reset(self) -> tuple[int, ...]:
        return (0,)

    def step(self, action: Sequence[int]) -> StepResult:
        self.turn += 1
        with self.src.lock:
            self.src.steps.append(self.task)
            if self.task == "T" and self.src.verdicts_running:
                self.src.violations.append("a T episode acted while a T verdict ran")
        done = self.task == "T" or self.turn >= self.src.u_turns
        if done and self.task == "U":
            self.src.u_done.set()
        return StepResult((1,), done)

    def verdict(self) -> float:
        with self.src.lock:
            self.src.verdicts_running += 1
        try:
            if self.task == "T":
                assert self.src.u_done.wait(WAIT_S)
            return 1.0
        finally:
            with self.src.lock:
                self.src.verdicts_running -= 1

    def close(self) -> None:
        with self.src.lock:
            self.src.closed += 1
            self.src.closed_cv.notify_all()


@pytest.mark.parametrize("prepared", [False, True], ids=["issued", "prepared_ahead"])
def test_a_next_steps_episode_does_not_act_while_a_verdict_of_its_task_runs(pool, prepared):
    src = AcrossSteps()
    loop = AgentLoop(src, one_token, pool, coalesce_s=0.0)
    events: list = []
    lock = threading.Lock()

    def emit(event) -> None:
        with lock:
            events.append(event)

    step1 = make_request(src, step=1, num_groups=2, group_size=1, seed=3)
    if prepared:  # the next step's resets, issued ahead of its weights
        loop.prepare(step1)
    first = loop.run(make_request(src, step=0, num_groups=1, group_size=1, seed=3), 0, emit)
    # Step 0's content is final; its T verdict now runs until step 1's U episode has submitted.
    second = loop.run(step1, 1, emit)
    assert first.wait(WAIT_S) and second.wait(WAIT_S)
    assert src.violations == []
    assert src.steps.count("T") == 2 and src.steps.count("U") == 3
    assert sorted(e.reward for e in events if isinstance(e, RewardReady)) == [1.0, 1.0, 1.0]


def test_an_episode_still_waiting_for_admission_is_closed_when_generation_fails(pool):
    src = AcrossSteps()
    loop = AgentLoop(src, one_token, pool, coalesce_s=0.0)
    first = loop.run(make_request(src, step=0, num_groups=1, group_size=1, seed=3), 0, lambda e: None)
    calls = []

    def fails_once_u_acted(requests):
        calls.append(len(requests))
        if len(calls) == 2:  # U's second turn; T of step 1 still waits for step 0's verdict
            raise RuntimeError("engine died")
        return one_token(requests)

    loop.generate = fails_once_u_acted
    with pytest.raises(RuntimeError, match="engine died"):
        loop.run(make_request(src, step=1, num_groups=2, group_size=1, seed=3), 1, lambda e: None)
    src.u_done.set()  # step 0's verdict ends
    assert first.wait(WAIT_S)
    with src.lock:
        assert src.steps == ["T", "U"] and src.violations == []
    assert loop._gate.acting(task_key("T")) == 0  # nothing is left counted as acting
    # Step 1's two environments and step 0's are closed (the waiting one once its reset returned).
    with src.closed_cv:
        assert src.closed_cv.wait_for(lambda: src.closed == 3, WAIT_S)
