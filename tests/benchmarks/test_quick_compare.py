"""benchmarks/quick_compare.py classes every leaf of two trees' quick runs (no timing thresholds)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load():
    spec = importlib.util.spec_from_file_location("bench_quick_compare", BENCH / "quick_compare.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _write(directory: Path, data: dict) -> None:
    directory.mkdir()
    (directory / "bench.json").write_text(json.dumps(data))


def test_leaves_are_equal_timing_curves_or_listed_and_curves_are_judged_against_a_rerun(tmp_path):
    base = {
        "settings": {"groups": 8},
        "step_s_median": 1.0,
        "planned_bytes": 100,
        "targets_met": {"x": True},
        "runs": [{"rewards": [0.1, 0.2, 0.3, 0.4]}],
        "modes": {"sync": {"reward_by_step": [0.5, 0.6]}},
    }
    _write(tmp_path / "before", base)
    _write(tmp_path / "rerun", {**base, "runs": [{"rewards": [0.1, 0.2, 0.9, 0.4]}]})
    _write(
        tmp_path / "after",
        {
            **base,
            "step_s_median": 1.3,
            "planned_bytes": 90,
            "runs": [{"rewards": [0.1, 0.2, 0.3, 0.5]}],
            "extra": 1,
        },
    )
    out = tmp_path / "cmp.json"
    summary = _load().main(
        [
            str(tmp_path / "before"),
            str(tmp_path / "after"),
            "--rerun",
            str(tmp_path / "rerun"),
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(summary))
    entry = summary["files"]["bench.json"]
    assert (entry["timing"], entry["curve"], entry["other"]) == (1, 1, 1)
    assert entry["other_leaves"] == [{"key": "planned_bytes", "before": 100, "after": 90}]
    assert entry["one_side_only"] == ["extra"]
    assert entry["curves"]["runs[0]"] == {
        "first_divergence_after": 3,
        "first_divergence_rerun": 2,
        "steps": [4, 4],
    }
    assert entry["curves"]["modes.sync"]["first_divergence_after"] is None
    assert summary["command"].startswith("python benchmarks/quick_compare.py ")
