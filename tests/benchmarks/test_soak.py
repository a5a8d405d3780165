"""A shorter soak (benchmarks/soak.py): after warm-up, resource use stays flat over 100 real steps.

Bounds: threads, open fds, child processes and /dev/shm segments of the learner and its children
exactly equal between step 20 and step 100; resident memory of the learner and of the engine grows
by less than 50 MB (allocator noise of this setup is a few MB).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


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
