"""Shared plumbing for benchmark scripts: arguments, timing, machine description, JSON + PNG output.

Conventions every script follows:

- ``--out DIR`` (default ``benchmarks/results``): where ``<name>.json`` (and ``<name>.png``) go;
- ``--quick``: a reduced run that finishes in a few minutes on a 2-core CPU machine;
- ``--threads N``: ``torch.set_num_threads`` (recorded in the result);
- results carry the exact command line, the machine, the git commit and a UTC timestamp, so a
  number in ``benchmarks/results`` can always be traced back to how it was produced.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "RESULTS_DIR",
    "add_common_args",
    "add_split_backward_arg",
    "add_score_forward_tokens_arg",
    "add_call_cap_args",
    "machine_info",
    "command_line",
    "write_result",
    "write_bar_chart",
    "timed",
    "timed_cpu",
    "median",
    "summary",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def add_common_args(
    parser: argparse.ArgumentParser, default_threads: int | None = None
) -> argparse.ArgumentParser:
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR, help="directory for <name>.json and <name>.png"
    )
    parser.add_argument("--quick", action="store_true", help="reduced run (minutes on a 2-core CPU)")
    parser.add_argument(
        "--threads",
        type=int,
        default=default_threads if default_threads is not None else (os.cpu_count() or 1),
        help="torch.set_num_threads",
    )
    return parser


def add_split_backward_arg(parser: argparse.ArgumentParser, what: str = "") -> None:
    """``--split-backward [auto|true|false]`` (bare: auto) and ``--no-split-backward`` (false): the
    value of ``ThunderSyncStrategy(split_backward=...)``, in ``args.split_backward``."""

    def value(text: str) -> bool | str:
        table = {"auto": "auto", "true": True, "false": False}
        if text.lower() not in table:
            raise argparse.ArgumentTypeError(f"--split-backward takes auto, true or false, not {text!r}")
        return table[text.lower()]

    parser.add_argument(
        "--split-backward", nargs="?", type=value, const="auto", default="auto",
        help=f"ThunderSyncStrategy(split_backward=auto|true|false){what}: a streaming learner call spans "
        "destinations with one backward (bare flag: auto)",
    )  # fmt: skip
    parser.add_argument("--no-split-backward", dest="split_backward", action="store_const", const=False)


def add_score_forward_tokens_arg(parser: argparse.ArgumentParser) -> None:
    """``--score-forward-tokens N``: ``GRPOPolicy(score_forward_tokens=N)``, defaulting to the
    policy's own default (read from its signature, so the two cannot drift)."""
    import inspect

    from thundersync_lightning.modules import GRPOPolicy

    default = inspect.signature(GRPOPolicy).parameters["score_forward_tokens"].default
    parser.add_argument(
        "--score-forward-tokens", type=int, default=default,
        help=f"GRPOPolicy(score_forward_tokens=...) (default {default}; 0: the padding share alone cuts)",
    )  # fmt: skip


def add_call_cap_args(parser: argparse.ArgumentParser) -> None:
    """``--max-batch-trajectories N``, ``--max-batch-tokens N`` and ``--min-batch-trajectories N|auto``:
    a learner call's caps (``ThunderSyncStrategy`` options), defaulting to the strategy's own defaults
    (read from its signature, so the two cannot drift)."""
    import inspect

    from thundersync_lightning.strategy import ThunderSyncStrategy

    defaults = inspect.signature(ThunderSyncStrategy).parameters
    rows, tokens = defaults["max_batch_trajectories"].default, defaults["max_batch_tokens"].default
    least = defaults["min_batch_trajectories"].default
    parser.add_argument(
        "--max-batch-trajectories", type=lambda v: v if v == "auto" else int(v), default=rows,
        help=f"ThunderSyncStrategy(max_batch_trajectories=...): rows of one learner call, an integer or auto "
        f"(default {rows})",
    )  # fmt: skip
    parser.add_argument(
        "--max-batch-tokens", type=int, default=tokens,
        help=f"ThunderSyncStrategy(max_batch_tokens=...): tokens of one learner call (default {tokens})",
    )  # fmt: skip
    parser.add_argument(
        "--min-batch-trajectories", type=lambda v: v if v == "auto" else int(v), default=least,
        help=f"ThunderSyncStrategy(min_batch_trajectories=...): rows a call waits for while content is "
        f"still to land, an integer or auto (default {least})",
    )  # fmt: skip


def command_line() -> str:
    """The command as typed (interpreter included), relative to the repository root when possible."""
    argv = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    return shlex.join(argv)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


_ENV_PREFIXES = ("MALLOC_", "OMP_", "MKL_", "KMP_", "PYTORCH_", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD")


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on (no host names or user data)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
    }
    # Settings that change the numbers without changing the code (allocator, thread pools).
    info["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)}
    try:
        info["load_average_1m_5m_15m"] = list(os.getloadavg())
    except OSError:
        pass
    try:
        import psutil

        info["memory_total_bytes"] = psutil.virtual_memory().total
    except ImportError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return info


def write_result(out_dir: Path | str, name: str, payload: Mapping[str, Any]) -> Path:
    """Write ``out_dir/<name>.json``: the payload plus command, machine, commit and timestamp."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "command": command_line(),
        "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
        "machine": machine_info(),
        **payload,
    }
    path = out / f"{name}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    return path


def write_bar_chart(
    path: Path | str,
    groups: Mapping[str, Mapping[str, float]],
    *,
    ylabel: str,
    title: str,
    hline: tuple[float, str] | None = None,
) -> Path | None:
    """A grouped bar chart: ``groups[group][bar] = value`` (same bars in every group), Agg backend.
    None, with a line on stderr, where matplotlib is not installed (a bare GPU machine): the
    benchmark's JSON carries every figure's numbers."""
    try:
        import matplotlib
    except ImportError:
        print(
            f"no matplotlib here: {Path(path).name} not drawn (its numbers are in the JSON)", file=sys.stderr
        )
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(groups)
    bars = list(dict.fromkeys(b for g in groups.values() for b in g))
    width = 0.8 / max(1, len(bars))
    fig, ax = plt.subplots(figsize=(min(12.0, max(5.0, 2.0 + 0.3 * len(names) * len(bars))), 4.0), dpi=100)
    for k, bar in enumerate(bars):
        xs = [i + (k - (len(bars) - 1) / 2) * width for i in range(len(names))]
        ax.bar(xs, [groups[n].get(bar, 0.0) for n in names], width, label=bar)
    if hline is not None:
        ax.axhline(hline[0], color="k", linestyle="--", linewidth=1, label=hline[1])
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call, wall clock."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def timed_cpu(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall seconds, process CPU seconds, result) of one call. CPU time (user + system, all threads)
    is what the call consumed, so it is far less sensitive than wall time to other jobs sharing the
    cores; quote both."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and count of a sample (seconds stay seconds)."""
    return {"median": median(values), "min": min(values), "max": max(values), "n": len(values)}
