"""The engine pool: N engines behind one RolloutEngine give exactly what one engine gives.

Groups are placed whole and balanced by count, every publish reaches every engine, events merge
in completion order over the engines, an engine's death is handled as that engine handles it
alone (restart and exact replay, or EngineError once its budget is spent), and shutting the pool
down leaves no process.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator

import pytest
from jsonargparse import ArgumentParser

from thundersync_lightning.core.errors import ConfigError, EngineError
from thundersync_lightning.rollout import (
    ContentReady,
    EmbeddedEngineConfig,
    EnginePool,
    EnginePoolConfig,
    RewardReady,
    RolloutEvent,
    RolloutRequest,
    TraceReplayEngineConfig,
    make_request,
    place_groups,
)

from .conftest import random_model
from .helpers import collect
from .procs import children, gone, wait_until
from .scripted import ScriptedTasks

pytestmark = pytest.mark.timeout(300)

# group g behaves as MODES[g % 3]: with 6 groups round robin puts a gated group on each of 2 engines
MODES = ("ok", "verdict_gated", "step_raises")


def _request(step: int, gate: str = "", groups: int = 6, modes: tuple[str, ...] = MODES) -> RolloutRequest:
    return make_request(
        ScriptedTasks(modes=modes, gate=gate), step=step, num_groups=groups, group_size=3, seed=4
    )


def _next_version(pool: EnginePool) -> int:
    return max(e.version for e in pool.engines) + 1


def _summary(events) -> dict[str, tuple]:
    """trajectory id -> (tokens, policy version, reward, failure), checking each event came once."""
    trajectories, rewards, order = collect(events)
    assert len(order) == 2 * len(trajectories) == 2 * len(rewards)
    return {
        tid: (t.tokens, t.policy_version, rewards[tid].reward, rewards[tid].failure)
        for tid, t in trajectories.items()
    }


@pytest.fixture(scope="module")
def pool(spec) -> Iterator[EnginePool]:
    before = children()
    config = EnginePoolConfig(
        engine=EmbeddedEngineConfig(env_workers=8, max_engine_restarts=1), num_engines=2
    )
    pool = config.build(spec, ScriptedTasks(modes=MODES))
    assert len({e.pid for e in pool.engines}) == 2  # type: ignore[attr-defined]
    yield pool
    pool.shutdown()
    assert wait_until(lambda: children() - before == set(), 10.0), "an engine process outlived the pool"


# -- placement ---------------------------------------------------------------------------------


def test_groups_are_placed_whole_round_robin_continuing_across_requests():
    assert place_groups(5, 2) == [0, 1, 0, 1, 0]
    assert place_groups(3, 2, cursor=5) == [1, 0, 1]
    # any request: the engines' group counts differ by at most one
    for groups in range(1, 9):
        for cursor in range(3):
            counts = Counter(place_groups(groups, 3, cursor))
            assert max(counts.values()) - min(counts.get(k, 0) for k in range(3)) <= 1


class _Recording:
    """A real (trace replay) engine that remembers the sub-requests it was given."""

    def __init__(self, engine) -> None:
        self.engine, self.requests = engine, []

    version = property(lambda self: self.engine.version)

    def publish(self, weights, version: int) -> None:
        self.engine.publish(weights, version)

    def rollout(self, request: RolloutRequest) -> Iterator[RolloutEvent]:
        self.requests.append(request)
        return self.engine.rollout(request)

    def shutdown(self) -> None:
        self.engine.shutdown()


def test_every_engine_gets_whole_groups_with_the_request_seed_and_global_group_indices(spec):
    replay = TraceReplayEngineConfig(time_scale_s=0.001)
    members = [_Recording(replay.build(spec)) for _ in range(3)]
    pool = EnginePool(members)
    pool.publish({}, version=0)
    request = make_request(ScriptedTasks(), step=3, num_groups=4, group_size=2, seed=9)
    _summary(pool.rollout(request))
    _summary(pool.rollout(make_request(ScriptedTasks(), step=4, num_groups=2, group_size=2, seed=9)))
    got = [[(r.step, r.seed, [g.group_index for g in r.groups]) for r in m.requests] for m in members]
    # 4 groups over 3 engines, then 2 more continuing from the cursor
    assert got == [[(3, 9, [0, 3])], [(3, 9, [1]), (4, 9, [0])], [(3, 9, [2]), (4, 9, [1])]]
    pool.shutdown()


class _Preparing(_Recording):
    """A recording engine that also implements PreparesAhead."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.prepared: list[RolloutRequest] = []

    def prepare(self, request: RolloutRequest) -> None:
        self.prepared.append(request)
        self.engine.prepare(request)


def test_the_pool_prepares_on_each_engine_the_groups_its_next_rollout_places_there(spec):
    replay = TraceReplayEngineConfig(time_scale_s=0.001)
    members = [_Preparing(replay.build(spec)), _Recording(replay.build(spec)), _Preparing(replay.build(spec))]
    pool = EnginePool(members)
    pool.publish({}, version=0)
    _summary(pool.rollout(make_request(ScriptedTasks(), step=0, num_groups=4, group_size=2, seed=9)))
    request = make_request(ScriptedTasks(), step=1, num_groups=4, group_size=2, seed=9)
    pool.prepare(request)  # engine 1 cannot prepare: it is skipped
    _summary(pool.rollout(request))
    for member in (members[0], members[2]):
        assert [(r.step, r.seed, r.groups) for r in member.prepared] == [
            (r.step, r.seed, r.groups) for r in member.requests[1:]
        ]
    pool.shutdown()


def test_a_pool_of_replay_engines_replays_what_one_replay_engine_replays(spec):
    replay = TraceReplayEngineConfig(time_scale_s=0.001)
    single, pool = replay.build(spec), EnginePoolConfig(engine=replay, num_engines=3).build(spec, None)
    request = make_request(ScriptedTasks(), step=1, num_groups=5, group_size=4, seed=2)
    for engine in (single, pool):
        engine.publish({}, version=0)
    assert _summary(pool.rollout(request)) == _summary(single.rollout(request))
    pool.shutdown()
    with pytest.raises(EngineError, match="shut down"):
        pool.rollout(request)


# -- embedded engines ----------------------------------------------------------------------------


def test_two_embedded_engines_return_the_trajectories_and_rewards_of_one(pool, spec, tmp_path):
    gate = tmp_path / "open"
    gate.touch()
    pool.publish(random_model(spec, 0).state_dict(), version=_next_version(pool))
    request = _request(1, str(gate))
    one = collect(pool.engines[0].rollout(request))  # the whole request on one engine
    two = collect(pool.rollout(request))
    assert _summary(two[2]) == _summary(one[2])
    assert {r.failure is None for r in one[1].values()} == {True, False}  # failures are paired too
    for tid, traj in two[0].items():  # logprobs of the same tokens, batched differently
        assert traj.sampling_logprobs == pytest.approx(one[0][tid].sampling_logprobs, abs=1e-5)


def test_a_publish_between_two_requests_applies_to_the_second_only_on_every_engine(pool, spec, tmp_path):
    gate = tmp_path / "open"
    gate.touch()
    base = _next_version(pool)
    pool.publish(random_model(spec, 1).state_dict(), version=base)
    first = pool.rollout(_request(2, str(gate)))
    pool.publish(random_model(spec, 2).state_dict(), version=base + 1)
    second = pool.rollout(_request(3, str(gate)))
    assert [e.version for e in pool.engines] == [base + 1, base + 1] and pool.version == base + 1
    assert {v[1] for v in _summary(second).values()} == {base + 1}
    assert {v[1] for v in _summary(first).values()} == {base}


def test_events_of_one_engine_are_not_held_back_by_another_engines_pending_verdicts(pool, spec, tmp_path):
    gate = tmp_path / "verdicts-may-finish"
    view = EnginePool(pool.engines)  # the same engines, placement from engine 0 (not shut down here)
    view.publish(random_model(spec, 3).state_dict(), version=_next_version(pool))
    # group 0 (gated verdicts) on engine 0, group 1 (answers at once) on engine 1
    events = view.rollout(_request(4, str(gate), groups=2, modes=("verdict_gated", "ok")))
    early = []
    while sum(isinstance(e, RewardReady) and e.group_id == "s4-g1" for e in early) < 3:
        early.append(next(events))
    assert not any(isinstance(e, RewardReady) and e.group_id == "s4-g0" for e in early)
    gate.touch()
    rest = list(events)
    assert sum(isinstance(e, ContentReady) for e in early + rest) == 6 == len(collect(early + rest)[1])


def test_a_killed_engine_of_the_pool_restarts_and_the_request_completes_with_the_same_trajectories(
    pool, spec, tmp_path
):
    gate, opened = tmp_path / "verdicts-may-finish", tmp_path / "open"
    opened.touch()
    pool.publish(random_model(spec, 4).state_dict(), version=_next_version(pool))
    reference = _summary(pool.rollout(_request(5, str(opened))))
    victim = pool.engines[1]
    restarts, dead = victim.restart_count, victim.pid  # type: ignore[attr-defined]
    events = pool.rollout(_request(5, str(gate), groups=6))
    early = [next(events)]
    os.kill(dead, signal.SIGKILL)
    gate.touch()
    assert _summary([*early, *events]) == reference
    assert victim.restart_count == restarts + 1 and victim.pid != dead  # type: ignore[attr-defined]
    assert wait_until(lambda: gone(dead), 10.0)


def test_an_engine_dying_past_its_restart_budget_fails_the_pool_and_shutdown_leaves_no_process(
    pool, spec, tmp_path
):
    # runs last on the module's pool: kill engine 1 until its restart budget (1) is spent
    # the pool's engine processes, restarts included (other modules' engines may be alive too)
    victim, started = pool.engines[1], {e.pid for e in pool.engines}  # type: ignore[attr-defined]
    while True:
        pool.publish(random_model(spec, 5).state_dict(), version=_next_version(pool))
        events = pool.rollout(_request(6, str(tmp_path / "never")))
        next(events)
        spent = victim.restart_count == victim.config.max_engine_restarts  # type: ignore[attr-defined]
        os.kill(victim.pid, signal.SIGKILL)  # type: ignore[attr-defined]
        if spent:
            break
        (tmp_path / "never").touch()
        _summary(list(events))
        (tmp_path / "never").unlink()
        started |= {e.pid for e in pool.engines}  # type: ignore[attr-defined]
    with pytest.raises(
        EngineError, match=r"engine 1 of 2 failed during step 6: .*died.*max_engine_restarts=1"
    ):
        list(events)
    version = _next_version(pool)
    with pytest.raises(EngineError, match="engine 1 of 2"):
        pool.publish(random_model(spec, 6).state_dict(), version=version)
    with pytest.raises(EngineError, match=f"publish of version {version} failed on engine 1"):
        pool.rollout(_request(7))
    pool.shutdown()
    pool.shutdown()  # idempotent
    assert wait_until(lambda: all(gone(pid) for pid in started), 10.0), "an engine process outlived the pool"


# -- configuration -------------------------------------------------------------------------------


def test_an_invalid_pool_config_lists_every_problem_at_once():
    with pytest.raises(ConfigError) as err:
        EnginePoolConfig(
            engine=EmbeddedEngineConfig(),
            num_engines=2,
            per_engine=[{"temperature": 0.5}, {"devise": "cpu"}, {}],
        )
    message = str(err.value)
    assert "per_engine has 3 entries for num_engines=2" in message
    assert "per_engine[0] sets temperature" in message
    assert "'devise' (did you mean 'device'?)" in message
    with pytest.raises(ConfigError, match="num_engines=0: must be >= 1"):
        EnginePoolConfig(engine=EmbeddedEngineConfig(), num_engines=0)
    with pytest.raises(ConfigError, match="str has no `build`"):
        EnginePoolConfig(engine="embedded")  # type: ignore[arg-type]


def test_per_engine_places_each_engine_and_the_pool_reads_as_its_engine_for_the_sampling_checks():
    config = EnginePoolConfig(
        engine=EmbeddedEngineConfig(temperature=0.7, top_p=0.9),
        num_engines=2,
        per_engine=[{}, {"device": "cuda:1"}],
    )
    assert [m.device for m in config.members()] == ["cpu", "cuda:1"]
    assert config.sampling == EmbeddedEngineConfig(temperature=0.7, top_p=0.9).sampling
    assert (config.sampling.temperature, config.sampling.top_p, config.sampling.teacher) == (0.7, 0.9, False)
    replay = EnginePoolConfig(engine=TraceReplayEngineConfig())
    assert replay.sampling.logprobs is False and replay.members() == [TraceReplayEngineConfig()] * 2


def test_the_pool_is_constructible_from_yaml_with_its_engine_as_a_class_path():
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--engine", type=EnginePoolConfig)
    cfg = parser.parse_string(
        "engine:\n"
        "  num_engines: 3\n"
        "  engine:\n"
        "    class_path: thundersync_lightning.rollout.EmbeddedEngineConfig\n"
        "    init_args: {temperature: 0.8, env_workers: 4}\n"
        "  per_engine: [{}, {device: 'cuda:1'}, {device: 'cuda:2'}]\n"
    )
    init = parser.instantiate_classes(cfg)
    assert init.engine == EnginePoolConfig(
        engine=EmbeddedEngineConfig(temperature=0.8, env_workers=4),
        num_engines=3,
        per_engine=[{}, {"device": "cuda:1"}, {"device": "cuda:2"}],
    )


def test_a_vllm_engine_with_worker_processes_runs_on_its_learner_ranks_gpu_unless_placed():
    from thundersync_lightning.rollout.vllm.config import VLLMEngineConfig
    from thundersync_lightning.rollout.vllm.engine import colocated_device_ids

    workers = VLLMEngineConfig(multiprocessing=True, weight_sync="file")
    assert colocated_device_ids(workers, learner_device=3, accepts=True) == [3]
    assert colocated_device_ids(workers, learner_device=None, accepts=True) is None  # no CUDA: vLLM decides
    assert colocated_device_ids(workers, learner_device=3, accepts=False) is None  # a vLLM without device_ids
    assert colocated_device_ids(VLLMEngineConfig(), learner_device=3, accepts=True) is None  # in-process
    tp = VLLMEngineConfig(multiprocessing=True, weight_sync="file", tensor_parallel_size=2)
    assert colocated_device_ids(tp, learner_device=2, accepts=True) is None
    # a pool placing its engines explicitly: per_engine device_ids win
    pool = EnginePoolConfig(
        engine=workers, per_engine=[{"engine_kwargs": {"device_ids": [k]}} for k in (4, 5)]
    )
    assert [colocated_device_ids(m, learner_device=0, accepts=True) for m in pool.members()] == [None, None]
    assert [m.engine_kwargs["device_ids"] for m in pool.members()] == [[4], [5]]
    with pytest.raises(ConfigError, match="multiprocessing=False"):
        EnginePoolConfig(engine=VLLMEngineConfig(), num_engines=2)


def test_auto_weight_sync_follows_where_the_engine_runs():
    from thundersync_lightning.rollout.vllm.config import VLLMEngineConfig
    from thundersync_lightning.rollout.vllm.placement import resolve_weight_sync

    in_process = VLLMEngineConfig()
    workers = VLLMEngineConfig(multiprocessing=True)
    tp = VLLMEngineConfig(multiprocessing=True, tensor_parallel_size=2)
    assert resolve_weight_sync(in_process, 0, [0], cuda=True) == "direct"
    assert resolve_weight_sync(workers, None, [0], cuda=False) == "file"  # no CUDA: the file
    assert resolve_weight_sync(workers, 3, [3], cuda=True) == "ipc"  # the learner's own GPU
    assert resolve_weight_sync(workers, None, [0], cuda=True) == "ipc"  # CUDA not initialised yet: GPU 0
    assert resolve_weight_sync(workers, 0, [1], cuda=True) == "nccl"  # another GPU
    assert resolve_weight_sync(tp, 0, [0, 1], cuda=True) == "nccl"
    explicit = VLLMEngineConfig(multiprocessing=True, weight_sync="file")
    assert resolve_weight_sync(explicit, 0, [0], cuda=True) == "file"
