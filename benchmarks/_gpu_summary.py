"""The GPU check's summary: one row per section of ``OUT/sections.tsv`` with its headline numbers.

    python benchmarks/_gpu_summary.py OUT      # prints the table, writes OUT/summary.md and summary.json
    python benchmarks/_gpu_summary.py --plan COMMITTED_TSV BUDGET_S name=limit ...
                                               # the planned seconds per section of a GPU slot

The plan takes a section's seconds from the committed GPU run (``COMMITTED_TSV``) where it
finished there, else its limit (a section not yet run on a GPU, or one that timed out); sections
past ``BUDGET_S`` are named (run them with ``ONLY=`` in a second command).

Run by ``benchmarks/gpu_check.sh`` after every section (so a slot that ends early keeps the table
of what finished). A section whose JSON is missing or unreadable gets that said in its row.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def verify(out: Path) -> list[str]:
    data = _load(out / "verify" / "verify.json")
    if data is None:
        return []
    rows = []
    for r in data["runs"]:
        what = f"{r['model']} {r['precision']}{' LoRA' if r.get('lora') else ''}"
        if "inconclusive" in r:
            rows.append(f"{what}: inconclusive ({r['inconclusive']})")
            continue
        rows.append(
            f"{what}: difference {r['relative_difference']:.2e} (tolerance {r['tolerance']:.0e}, "
            f"{'PASS' if r['passed'] else 'FAIL'}), worst {r['worst_relative_difference']:.2e} "
            f"{r['worst_parameter']}, {r['seconds']:.0f} s"
        )
    return rows


#: the peers' publish seconds (issue 45): TRL's async GRPO, NeMo-RL
PEERS = "peers: TRL async GRPO ~0.18 s (Qwen3-0.6B), NeMo-RL 0.2-0.3 s (Qwen3-4B)"


def overlap(out: Path, folder: str = "overlap", name: str = "overlap_long") -> list[str]:
    data = _load(out / folder / f"{name}.json")
    if data is None:
        return []
    rows = [
        f"streaming {data['speedup_streaming_vs_sync']:.2f}x sync, async "
        f"{data['speedup_async_vs_sync']:.2f}x sync, efficiency {data['efficiency']:.2f}"
    ]
    for mode, r in data["modes"].items():
        rows.append(
            f"{mode}: step {r['median_step_s']:.3f} s, idle "
            f"{r['learner_idle_fraction']:.1%}, MFU {r['mfu']:.1%}"
        )
    return rows


def paper(out: Path, folder: str) -> list[str]:
    data = _load(out / folder / "overlap_paper.json")
    if data is None:
        return []
    rows = overlap(out, folder, "overlap_paper")
    lengths = data["workload"]["trajectory_tokens_min_mean_max"]
    n = data["model"]["num_params"]
    size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"
    rows.insert(
        0,
        f"{size} parameters, {data['workload']['precision']}, "
        f"trajectories {lengths[0]}-{lengths[2]} tokens (mean {lengths[1]:.0f}), bound "
        f"{data['bound_speedup']:.2f}x (paper: streaming 1.91x, async 1.90x, MFU 24% -> 46%)",
    )
    v = data.get("vram", {})
    extra, planned = (
        v.get("streaming_extra_over_sync_bytes"),
        v.get("planned_streaming_extra_over_sync_bytes"),
    )
    peaks = ", ".join(f"{m} {_gib(b)}" for m, b in v.get("peak_bytes", {}).items())
    rows.append(f"peak VRAM {peaks}; streaming extra {_gib(extra)} (planned {_gib(planned)}; paper +5.8 GB)")
    return rows


def engine(out: Path) -> list[str]:
    data = _load(out / "engine" / "gpu_engine.json")
    if data is None:
        return []
    return [
        f"{data['model']} ({data['parameters'] / 1e6:.2f}M, {data['precision']}): engine "
        f"{data['engine_tokens_per_s_median']:.0f} tokens/s, learner idle "
        f"{data['learner_idle_fraction_median']:.1%}, staleness max {data['staleness_max']}, "
        f"{data['turns_mean']:.2f} turns, {data['tool_calls']} valid and {data['invalid_tool_calls']} "
        "invalid tool calls (random weights)"
    ]


def memory(out: Path, model: str) -> list[str]:
    data = _load(out / f"memory_{model}" / "gpu_scale.json")
    if data is None:
        return []
    rows = []
    for name, r in data["variants"].items():
        if "skipped" in r:
            rows.append(f"{name}: skipped ({r['skipped']})")
            continue
        ratio = r.get("peak_over_planned")
        rows.append(
            f"{name}: peak {_gib(r['peak_device_bytes'])}, planned {_gib(r['planned_device_bytes'])}"
            + ("" if ratio is None else f", peak/planned {ratio:.2f}")
            + f", step {r['median_step_s']:.3f} s"
        )
    return rows


def offload(out: Path) -> list[str]:
    data = _load(out / "offload" / "offload.json")
    if data is None:
        return []
    ratios = ", ".join(f"{k} {v:.3f}" for k, v in data["ratio_to_none"].items())
    rows = [
        f"held backward time / offload none, host buffers reserved: {ratios} "
        f"({data['parameters'] / 1e6:.2f}M parameters)"
    ]
    if "ratio_to_none_unreserved" in data:
        unreserved = ", ".join(f"{k} {v:.3f}" for k, v in data["ratio_to_none_unreserved"].items())
        rows.append(f"allocated in the backward (no bounds): {unreserved}")
    return rows


def weight_sync(out: Path, model: str) -> list[str]:
    data = _load(out / f"weight_sync_{model}" / "weight_sync_transport.json")
    if data is None:
        return []
    rows = []
    for t, r in data["transports"].items():
        if "median_s" not in r:
            rows.append(f"{t}: {r.get('skipped', 'no timing')}")
            continue
        ratio = data["ratio_to_file"].get(t)
        rows.append(
            f"{t} ({r['backend']}): {r['median_s']:.3f} s per publish"
            + ("" if ratio is None else f", {ratio:.2f}x file")
            + ("" if r.get("exact", True) else ", NOT EXACT")
        )
    rows += [f"{t}: skipped ({why})" for t, why in data.get("skipped", {}).items()]
    return [f"{data['model']} {_gib(data['state_dict_bytes'])}: " + "; ".join(rows), PEERS]


def split_backward(out: Path) -> list[str]:
    data = _load(out / "split_backward" / "split_backward.json")
    if data is None:
        return []
    return [
        f"{name} ({r['parameters'] / 1e6:.1f}M parameters, {r['destinations']} destinations): separate/split "
        f"{r['separate_over_split_wall']:.2f}x, per-destination/split {r['per_job_over_split_wall']:.2f}x"
        for name, r in data["models"].items()
    ]


SECTIONS: dict[str, Callable[[Path], list[str]]] = {
    "paper": lambda out: paper(out, "paper"),
    "paper_0.6B": lambda out: paper(out, "paper_0.6B"),
    "engine": engine,
    "weight_sync_0.6B": lambda out: weight_sync(out, "0.6B"),
    "weight_sync_1.7B": lambda out: weight_sync(out, "1.7B"),
    "verify": verify,
    "overlap": overlap,
    "memory_0.6B": lambda out: memory(out, "0.6B"),
    "memory_1.7B": lambda out: memory(out, "1.7B"),
    "memory_tiny": lambda out: memory(out, "tiny"),
    "offload": offload,
    "split_backward": split_backward,
}


def main(out_dir: str) -> dict[str, Any]:
    out = Path(out_dir)
    table = ["| section | status | seconds | results |", "|---|---|---|---|"]
    record: dict[str, Any] = {}
    tsv = out / "sections.tsv"
    for line in tsv.read_text().splitlines() if tsv.is_file() else []:
        name, status, seconds, note = (line.split("\t") + ["", "", ""])[:4]
        try:
            rows = SECTIONS[name](out) if name in SECTIONS else []
        except (KeyError, TypeError, ValueError) as exc:  # a JSON of another shape: say so, keep going
            rows = [f"unreadable results: {type(exc).__name__}: {exc}"]
        if status != "ok":
            rows = [note, *rows]
        record[name] = {"status": status, "seconds": int(seconds or 0), "results": rows}
        table.append(f"| {name} | {status} | {seconds} | {'<br>'.join(rows) or 'no results written'} |")
    text = "\n".join(table) + "\n"
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(record, indent=2) + "\n")
    print(text)
    return record


def plan(committed_tsv: str, budget_s: int, limits: list[str]) -> str:
    """Planned seconds per section of a GPU slot (module docstring), as a table."""
    done: dict[str, tuple[str, int]] = {}
    path = Path(committed_tsv)
    for line in path.read_text().splitlines() if path.is_file() else []:
        name, status, seconds = (line.split("\t") + ["", "", ""])[:3]
        done[name] = (status, int(seconds or 0))
    later: list[str] = []
    lines = [
        f"planned seconds per section on a GPU (BUDGET_S={budget_s}; from {committed_tsv}):",
        f"{'section':18} {'limit':>6} {'planned':>8} {'total':>6}  source",
    ]
    total = 0
    for item in limits:
        name, limit_text = item.split("=")
        limit = int(limit_text)
        status, seconds = done.get(name, ("", 0))
        planned = min(seconds, limit) if status == "ok" else limit
        source = (
            "the committed GPU run (at most its limit)"
            if status == "ok"
            else f"its limit ({status} in the committed GPU run)"
            if status
            else "its limit: not yet run on a GPU"
        )
        if name == "paper_0.6B":
            lines.append(
                f"{name:18} {limit:>6} {planned:>8} {'':>6}  {source}; only when paper does not finish"
            )
            continue
        total += planned
        if total > budget_s:
            later.append(name)
        lines.append(
            f"{name:18} {limit:>6} {planned:>8} {total:>6}  "
            f"{source}{'  (past BUDGET_S)' if total > budget_s else ''}"
        )
    if later:
        lines.append(
            f"past the budget: a second command, ONLY='{' '.join(later)}' "
            f"({sum(int(i.split('=')[1]) for i in limits if i.split('=')[0] in later)} s at most)"
        )
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    if sys.argv[1] == "--plan":
        plan(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    else:
        main(sys.argv[1])
