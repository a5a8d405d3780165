"""Recorded rollouts: a replay yields the recorded events, in order and on the recorded schedule."""

from __future__ import annotations

import pytest

from thundersync_lightning.core.errors import EngineError
from thundersync_lightning.envs.toy import GuessingGameTasks
from thundersync_lightning.rollout import ContentReady, ModelSpec, TraceReplayEngineConfig, make_request
from thundersync_lightning.rollout.recorded import RecordedEngines, RecordingEngines

SPEC = ModelSpec(config={"vocab_size": 16})
TASKS = GuessingGameTasks(latency="none")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_replay_yields_the_recorded_events_in_order_with_their_times_moved_to_the_replay():
    recorder = RecordingEngines(TraceReplayEngineConfig(time_scale_s=1e-4))
    live = recorder.build(SPEC, TASKS)
    live.publish({}, version=0)
    request = make_request(TASKS, step=0, num_groups=2, group_size=3, seed=7)
    recorded = list(live.rollout(request))
    assert len(recorded) == 12 and recorder.recording.num_events == 12

    replay = RecordedEngines(recorder.recording).build(SPEC, TASKS)
    replay.publish({}, version=0)
    clock = Clock()
    replayed = list(recorder.recording.replay(request, clock=clock))  # due at 100 + the recorded delays
    assert [type(e) for e in replayed] == [type(e) for e in recorded]
    for a, b in zip(replayed, recorded):
        if isinstance(a, ContentReady):
            assert a.trajectory.tokens == b.trajectory.tokens and a.trajectory.policy_version == 0
            assert a.trajectory.segments == b.trajectory.segments
        else:
            assert (a.trajectory_id, a.reward) == (b.trajectory_id, b.reward)
    shift = replayed[0].time - recorded[0].time
    assert all(a.time - b.time == pytest.approx(shift) for a, b in zip(replayed, recorded))
    assert replay.version == 0 and len(list(replay.rollout(request))) == 12  # replays as often as asked


def test_a_replay_refuses_a_request_that_was_not_recorded():
    recorder = RecordingEngines(TraceReplayEngineConfig(time_scale_s=1e-4))
    live = recorder.build(SPEC, TASKS)
    live.publish({}, version=0)
    list(live.rollout(make_request(TASKS, step=0, num_groups=2, group_size=2, seed=0)))
    replay = RecordedEngines(recorder.recording).build(SPEC, TASKS)
    with pytest.raises(EngineError, match="step 1 .* not recorded"):
        replay.rollout(make_request(TASKS, step=1, num_groups=2, group_size=2, seed=0))
