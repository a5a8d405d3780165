"""benchmarks/vs_trl.py: its quick mode runs TRL 1.16's GRPOTrainer and both project modes end to
end on both tasks and writes the JSON the README tables read (no timing thresholds); its step
arithmetic is checked on hand-made probe lines."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def _load():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_vs_trl", BENCH / "vs_trl.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _line(step: int, wall: float, cpu: float, reward: float) -> dict:
    return {
        "step": step,
        "wall": wall,
        "cpu": {"total": cpu, "main": cpu, "workers": 0.0, "other": 0.0},
        "tokens": 10,
        "completions": 4,
        "reward": reward,
        "failures": 0,
        "tool_calls": 0,
    }


def test_a_step_is_the_difference_of_two_probe_lines_and_the_target_needs_a_full_window() -> None:
    vs_trl = _load()
    lines = [
        {"step": 0, "wall": 10.0, "cpu": {"total": 1.0, "main": 1.0, "workers": 0.0, "other": 0.0}},
        _line(1, 10.5, 1.25, 0.9),
        _line(2, 11.5, 2.0, 0.1),
        _line(3, 12.0, 2.5, 0.9),
        _line(4, 12.25, 3.0, 0.9),
    ]
    steps = vs_trl.per_step(lines)
    assert [s["wall_s"] for s in steps] == [0.5, 1.0, 0.5, 0.25]
    assert [s["cpu_s"] for s in steps] == [0.25, 0.75, 0.5, 0.5]
    # window 2: step 1 alone is not a window; (0.9 + 0.1) / 2 and (0.1 + 0.9) / 2 miss 0.8; steps 3-4 reach it
    assert vs_trl.time_to_target(steps, 0.8, 2) == {"steps": 4, "seconds": 2.25}
    assert vs_trl.time_to_target(steps, 0.95, 2) == {"steps": None, "seconds": None}


@pytest.mark.slow
def test_quick_mode_runs_trl_and_both_project_modes_on_both_tasks_with_equal_batches(tmp_path: Path) -> None:
    trl_python = os.environ.get("TRL_PEER_PYTHON", str(ROOT / ".venv-trl" / "bin" / "python"))
    if not Path(trl_python).exists():
        pytest.skip("no TRL 1.16 environment: `make test-slow` builds .venv-trl")
    path = _load().main(["--quick", "--seeds", "0", "--trl-python", trl_python, "--out", str(tmp_path)])
    data = json.loads(path.read_text())
    assert data["command"] and data["load_average_start"] and data["trl_version"] == "1.16.0"
    assert (tmp_path / "vs_trl.png").stat().st_size > 0
    assert set(data["unmatched"]) and data["matched"]["completions_per_step"] == 64
    for kind in ("single", "tool"):
        configs = data["tasks"][kind]["configs"]
        assert set(configs) == {"trl", "streaming", "sync"}
        for c in configs.values():
            assert (
                c["step_s_median"] > 0 and c["cpu_s_per_step_median"] > 0 and c["completions_per_step"] == 64
            )
            assert c["tokens_per_step_median"] > 0 and len(c["reward_by_step"]) == 6
        assert set(data["tasks"][kind]["ratios"]) == {
            "streaming_over_trl",
            "sync_over_trl",
            "streaming_over_sync",
        }
        for mode in ("streaming", "sync"):
            assert configs[mode]["learner_calls_per_step"] >= 1 and configs[mode]["failures_total"] == 0
    assert set(data["tasks"]["single"]["targets"]) >= {
        "streaming_step_over_trl",
        "streaming_cpu_over_trl",
        "streaming_step_over_sync",
    }
