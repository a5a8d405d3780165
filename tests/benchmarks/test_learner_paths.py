"""benchmarks/learner_paths.py: one rep of each case runs the real step runner and writes the JSON
the methods doc quotes; the call counts and paths are the behaviour the defaults change (no timing)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_learner_paths_cuts_sync_in_one_call_and_waits_for_rewards_instead_of_holding(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_learner_paths", BENCH / "learner_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = json.loads(module.main(["--reps", "1", "--out", str(tmp_path)]).read_text())
    cases = data["cases"]
    assert (cases["sync_rows_32"]["learner_calls"], cases["sync_rows_auto"]["learner_calls"]) == (2, 1)
    assert cases["streaming_held"]["paths"] == ["held"]  # 64 rows, one split call, then 64 folds
    assert set(cases["streaming_waited"]["paths"]) == {"direct"}  # whole groups, rewards known
    assert all(c["cpu_s_median"] > 0 for c in cases.values()) and data["command"]
