"""``python -m thundersync_lightning.show DIR [-n N]``: a run's summary and its last trajectories.

Reads ``DIR/summary.json`` (if the run has finished a fit) and ``DIR/trajectories.jsonl`` (written
by :class:`~thundersync_lightning.callbacks.TrajectoryLogger`) and prints the last ``N``
trajectories, decoded: prompt, each action and observation, reward, failure. Without ``-n`` it
prints every trajectory logged for the last step. Model text is escaped and framed
(:func:`~thundersync_lightning.callbacks.trajectories.format_trajectory`): a completion cannot
print a header, a turn or a terminal control sequence of its own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .callbacks.trajectories import format_trajectory, printable, read_trajectories
from .summary import format_summary

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m thundersync_lightning.show", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "run_dir", help="the run directory (trainer.default_root_dir), or a trajectories.jsonl"
    )
    parser.add_argument("-n", type=int, default=None, help="how many trajectories (default: the last step's)")
    args = parser.parse_args(argv)
    path = Path(args.run_dir)
    run_dir = path if path.is_dir() else path.parent
    summary = run_dir / "summary.json"
    if summary.is_file():
        facts = json.loads(summary.read_text())  # its reasons may quote model text: one escaped line each
        print(
            format_summary(
                {k: printable(v, newlines=False) if isinstance(v, str) else v for k, v in facts.items()},
                run_dir,
            )
        )
        print()
    jsonl = path if path.is_file() else run_dir / "trajectories.jsonl"
    if not jsonl.is_file():
        print(
            f"{jsonl} does not exist: add thundersync_lightning.callbacks.TrajectoryLogger to the run",
            file=sys.stderr,
        )
        return 1
    entries = read_trajectories(jsonl)
    if args.n is None:
        last = entries[-1]["step"] if entries else None
        entries = [e for e in entries if e["step"] == last]
    else:
        entries = entries[-args.n :] if args.n > 0 else []
    for entry in entries:
        print(format_trajectory(entry))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
