"""`make demo`'s figures as a results file: run the demo's fit, copy its summary into ``demo.json``.

Runs exactly the fit `make demo` runs (``thundersync-lightning fit --config configs/toy.yaml
--trainer.default_root_dir=RUN``) in a child process, times it end to end, and writes
``<out>/demo.json``: the run's ``summary.json`` (mode, steps, first/last mean reward, staleness,
learner idle fraction, median step, wall seconds of the fit) plus the child's wall seconds, the load
average before and after, the command, machine and commit. The README quotes ``make demo``'s
figures from this file only.

    .venv/bin/python benchmarks/demo_run.py                 # writes benchmarks/results/demo.json
    .venv/bin/python benchmarks/demo_run.py --max-steps 3 --out /tmp/demo   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS_DIR, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/toy.yaml"


def fit_command(run_dir: Path, max_steps: int | None) -> list[str]:
    """`make demo`'s fit (the console script ``thundersync-lightning`` is ``cli:main``)."""
    cmd = [
        sys.executable, "-c", "from thundersync_lightning.cli import main; main()",
        "fit", "--config", CONFIG, f"--trainer.default_root_dir={run_dir}",
    ]  # fmt: skip
    if max_steps is not None:
        cmd.append(f"--trainer.max_steps={max_steps}")
    return cmd


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for demo.json")
    parser.add_argument(
        "--run-dir", type=Path, default=ROOT / "runs" / "demo", help="the fit's default_root_dir"
    )
    parser.add_argument(
        "--max-steps", type=int, default=None, help="override the config's 300 steps (smoke runs)"
    )
    args = parser.parse_args(argv)

    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE=os.environ.get("WANDB_MODE", "offline"))
    load_start = [round(x, 2) for x in os.getloadavg()]
    start = time.perf_counter()
    subprocess.run(fit_command(args.run_dir, args.max_steps), cwd=ROOT, env=env, check=True)
    wall = time.perf_counter() - start
    summary = json.loads((args.run_dir / "summary.json").read_text())
    payload = {
        "description": "make demo's fit (configs/toy.yaml): the run's summary.json and its wall time",
        "config": CONFIG,
        "max_steps_override": args.max_steps,
        "fit_process_wall_seconds": wall,
        "summary": summary,
        "load_average_start": load_start,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
    }
    return write_result(args.out, "demo", payload)


if __name__ == "__main__":
    print(main())
