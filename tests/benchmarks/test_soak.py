"""A shorter soak (benchmarks/soak.py): after warm-up, resource use stays flat over 100 real steps.

Bounds: threads, open fds, child processes and /dev/shm segments of the learner and its children
exactly equal between steps 20-24 and steps 96-100 (each window's minimum, see ``soak.Sampler``);
resident memory of the learner and of the engine grows by less than 50 MB (allocator noise of this
setup is a few MB).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _soak_module():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_soak", BENCH / "soak.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    return soak


@pytest.mark.parametrize(
    "fds_at, grows",
    [
        (lambda step: 40 + (step % 3 == 1) + 2 * (step % 7 == 0), False),  # a snapshot in flight now and then
        (lambda step: 40 + (step >= 60), True),  # one fd that stays
        (lambda step: 40 + step // 10, True),  # a steady leak
    ],
    ids=["transient", "one-kept", "steady"],
)
def test_the_soak_sampler_sees_a_kept_fd_but_not_one_in_flight(monkeypatch, fds_at, grows) -> None:
    soak = _soak_module()
    step = types.SimpleNamespace(global_step=0)
    monkeypatch.setattr(soak, "sample", lambda: {"fds": fds_at(step.global_step), "threads": 20})
    sampler = soak.Sampler(warmup=20, last=100, every=20, window=5)
    for step.global_step in range(1, 101):
        sampler.on_train_batch_end(step)
    assert sampler.before["window_steps"] == [20, 21, 22, 23, 24]
    assert sampler.after["window_steps"] == [96, 97, 98, 99, 100]
    assert [s["step"] for s in sampler.series] == [20, 40, 60, 80, 100]
    assert (sampler.after["fds"] > sampler.before["fds"]) is grows
    if not grows:  # the readings at steps 20 and 100 alone would have called it a leak
        assert sampler.series[-1]["fds"] > sampler.series[0]["fds"]
    assert sampler.after["threads"] == sampler.before["threads"] == 20


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_hundred_toy_steps_leak_no_thread_fd_process_shm_segment_or_memory(tmp_path: Path) -> None:
    # a fresh interpreter, as the benchmark runs: threads that earlier tests' fits leave behind for
    # a few seconds (Lightning's child-process observer sleeps 5 s before it ends) are not ours
    subprocess.run(
        [sys.executable, str(BENCH / "soak.py"), "--out", str(tmp_path), "--steps", "100", "--warmup", "20",
         "--groups", "4", "--group-size", "4", "--every", "20", "--rss-bound-mb", "50"],
        check=True, timeout=840,
    )  # fmt: skip
    data = json.loads((tmp_path / "soak.json").read_text())
    before, after = data["before"], data["after"]
    assert (before["step"], after["step"]) == (20, 100)
    for key in ("threads", "fds", "children", "shm_segments"):
        assert after[key] == before[key], f"{key} grew from {before[key]} to {after[key]}"
    assert after["children"] >= 1  # the engine was running when sampled
    assert after["rss_mb"] - before["rss_mb"] < 50
    assert after["engine_rss_mb"] - before["engine_rss_mb"] < 50
    assert data["all_flat"] is True
