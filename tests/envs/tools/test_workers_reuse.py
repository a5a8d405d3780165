"""A worker pool keeps every worker it started: a later wave of concurrent calls, as large as the
first, runs in the same processes (a fresh interpreter per call costs ~0.1 CPU-second, more than a
small model's whole step spends on 64 rewards)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from thundersync_lightning.envs.tools.confine import WorkerLimits
from thundersync_lightning.envs.tools.workers import ToolWorkers


def test_a_second_wave_of_twelve_concurrent_calls_runs_in_the_twelve_workers_of_the_first(
    tmp_path: Path,
) -> None:
    # the pool's reuse, not its confinement, is under test: plain processes see tmp_path and their own pids
    pool = ToolWorkers(limits=WorkerLimits(sandbox="rlimits"))
    # one set of calling threads for both waves, as the engine's environment threads: a worker dies
    # with the thread that started it (PR_SET_PDEATHSIG follows the parent thread)
    threads = ThreadPoolExecutor(12)
    try:

        def wave(name: str) -> set[str]:
            args = {"directory": str(tmp_path), "count": 12, "wave": name}
            outcomes = list(
                threads.map(lambda _: pool.call("tests.envs.worker_pids:meet", args, 90.0), range(12))
            )
            assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
            return {o.text for o in outcomes}

        first = wave("first")
        assert len(first) == 12 and "timeout" not in first  # twelve calls ran at once, one worker each
        assert wave("second") == first  # no worker was stopped, none started
    finally:
        threads.shutdown()
        pool.close()
