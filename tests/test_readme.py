"""The README's example runs as a script, as a newcomer would paste it, and gets what the CLI gets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow  # the README example trains for real (~20 s)
def test_the_readme_example_trains_prints_zero_staleness_and_writes_the_summary_curve_and_trajectories(
    tmp_path,
):
    text = README.read_text()
    start = text.index("```python\n") + len("```python\n")
    code = text[start : text.index("```", start)]
    assert "max_steps=300" in code
    script = tmp_path / "example.py"
    script.write_text(code.replace("max_steps=300", "max_steps=2"))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
    }
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "0"
    # not a terminal: the progress bar prints one line per step, with the step's mean reward
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1:3] for line in steps] == [["0", "(1/2)"], ["1", "(2/2)"]]
    assert all(re.search(r"reward=\d\.\d{3}", line) for line in steps)
    run = tmp_path / "runs" / "example"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["trajectories"] == 2 * 128
    assert 0.0 <= summary["reward_mean_last"] <= 1.0
    assert (run / summary["reward_curve"]).read_bytes().startswith(b"\x89PNG")
    assert "  reward curve           runs/example/reward_curve.png" in lines  # the printed summary links it
    assert len((run / "trajectories.jsonl").read_text().splitlines()) == 2 * 4
    assert (run / "checkpoints").is_dir()
    assert list((run / "wandb").glob("offline-run-*"))


@pytest.mark.parametrize(("path", "limit"), [("README.md", 150), ("benchmarks/README.md", 300)])
def test_the_readmes_stay_short(path: str, limit: int) -> None:
    """Issue 53: the front page and the benchmarks page stay readable; method detail goes to
    docs/benchmarks-methods.md."""
    lines = (README.parent / path).read_text().splitlines()
    assert len(lines) <= limit, f"{path} has {len(lines)} lines, over its limit of {limit}"
