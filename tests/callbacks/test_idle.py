from tests.callbacks.helpers import StubModule, end_step, record, stats, stub_trainer
from thundersync_lightning.callbacks import IdleTimeMonitor, draw_timeline, read_timeline
from thundersync_lightning.strategy.stats import Interval


def _step():
    # a 4 s step: first content at +0.5 s, the last reward at +3.5 s; busy 1 s backward,
    # 0.25 s barrier, 0.25 s optimizer, 0.5 s publish -> 2 s busy, 2 s idle
    busy = (
        Interval(100.5, 101.0, "backward", 1, "held", 10),
        Interval(101.0, 101.5, "backward", 2, "direct", 30),
        Interval(103.5, 103.75, "barrier"),
        Interval(103.75, 104.0, "optimizer"),
        Interval(103.0, 103.5, "publish"),
    )
    trajs = [
        record(0, content_at=100.5, reward_at=102.0),
        record(1, content_at=101.0, reward_at=103.5),
    ]
    return stats(trajs, start=100.0, end=104.0, busy=busy, open_groups=((100.5, 1), (103.5, 0)))


def test_idle_fraction_first_event_and_tail_are_logged_per_step(tmp_path):
    monitor, trainer, module = IdleTimeMonitor(dirpath=str(tmp_path)), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")
    end_step(monitor, trainer, module, _step())
    assert module.logged == {
        "perf/step_seconds": 4.0,
        "perf/learner_busy_seconds": 2.0,
        "perf/learner_idle_seconds": 2.0,
        "perf/learner_idle_fraction": 0.5,
        "perf/time_to_first_event_seconds": 0.5,
        "perf/tail_after_last_event_seconds": 0.5,
        "perf/learner_backward_seconds": 1.0,
        "perf/learner_barrier_seconds": 0.25,
        "perf/learner_optimizer_seconds": 0.25,
        "perf/learner_publish_seconds": 0.5,
        "perf/learner_calls": 2.0,
        "perf/learner_call_tokens": 20.0,
        "perf/learner_call_tokens_max": 30.0,
        "perf/learner_call_wait_rows": 1.0,
    }


def test_the_timeline_is_written_as_jsonl_relative_to_each_step_and_can_be_drawn(tmp_path):
    """A run from step 0 replaces an older run's file in the same directory."""
    (tmp_path / "timeline").mkdir()
    (tmp_path / "timeline" / "rank0.jsonl").write_text('{"step": 0, "from": "an older run"}\n')
    monitor, trainer, module = IdleTimeMonitor(), stub_trainer(log_dir=str(tmp_path)), StubModule()
    monitor.setup(trainer, module, "fit")
    end_step(monitor, trainer, module, _step())
    end_step(monitor, trainer, module, stats([record(0, step=1)], step=1, start=200.0, end=201.0))
    assert monitor.timeline_path == tmp_path / "timeline" / "rank0.jsonl"
    first, second = read_timeline(monitor.timeline_path)
    assert (first["step"], second["step"]) == (0, 1)
    assert first["busy"][0] == {"start": 0.5, "end": 1.0, "kind": "backward", "trajectories": 1, "tokens": 10,
                                "path": "held"}  # fmt: skip
    assert first["busy"][2] == {"start": 3.5, "end": 3.75, "kind": "barrier"}
    assert first["trajectories"][1] == {
        "id": "s0-g0-t1", "group": "s0-g0", "content_ready": 1.0, "reward_ready": 3.5, "num_tokens": 10,
    }  # fmt: skip
    assert first["open_groups"] == [[0.5, 1], [3.5, 0]]
    assert first["idle_fraction"] == 0.5 and first["wall_seconds"] == 4.0

    import matplotlib

    matplotlib.use("Agg")
    ax = draw_timeline([first, second])
    assert [t.get_text() for t in ax.get_yticklabels()][-2:] == ["content", "reward"]


def test_a_resumed_run_appends_to_the_timeline(tmp_path):
    monitor, trainer, module = IdleTimeMonitor(dirpath=str(tmp_path)), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")
    end_step(monitor, trainer, module, stats([record(0, step=0)], step=0))
    resumed = IdleTimeMonitor(dirpath=str(tmp_path))
    resumed.setup(trainer, module, "fit")
    end_step(resumed, trainer, module, stats([record(0, step=1)], step=1, start=200.0, end=201.0))
    assert [r["step"] for r in read_timeline(tmp_path / "timeline" / "rank0.jsonl")] == [0, 1]


def test_a_step_without_learner_calls_logs_zero_calls_and_no_mean_tokens_per_call():
    monitor, trainer, module = IdleTimeMonitor(write_timeline=False), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")
    end_step(monitor, trainer, module, stats([record(0)], start=0.0, end=1.0))
    assert module.logged["perf/learner_calls"] == 0.0 and module.logged["perf/learner_call_tokens_max"] == 0.0
    assert "perf/learner_call_tokens" not in module.logged  # an empty mean is not a 0
