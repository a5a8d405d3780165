"""The GPU check's summary: one row per section of ``OUT/sections.tsv`` with its headline numbers.

    python benchmarks/_gpu_summary.py OUT      # prints the table, writes OUT/summary.md and summary.json

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


def overlap(out: Path) -> list[str]:
    data = _load(out / "overlap" / "overlap_long.json")
    if data is None:
        return []
    rows = [
        f"streaming {data['speedup_streaming_vs_sync']:.2f}x sync, async {data['speedup_async_vs_sync']:.2f}x "
        f"sync, efficiency {data['efficiency']:.2f}"
    ]
    for mode, r in data["modes"].items():
        rows.append(
            f"{mode}: step {r['median_step_s']:.3f} s, idle {r['learner_idle_fraction']:.1%}, MFU {r['mfu']:.1%}"
        )
    return rows


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
    return [f"held backward time / offload none: {ratios} ({data['parameters'] / 1e6:.0f}M parameters)"]


def weight_sync(out: Path) -> list[str]:
    files = sorted((out / "weight_sync").glob("*.json"))
    return [f"{f.name}: {json.dumps(json.loads(f.read_text()))[:300]}" for f in files]


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
    "verify": verify,
    "overlap": overlap,
    "memory_0.6B": lambda out: memory(out, "0.6B"),
    "memory_1.7B": lambda out: memory(out, "1.7B"),
    "memory_tiny": lambda out: memory(out, "tiny"),
    "offload": offload,
    "weight_sync": weight_sync,
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


if __name__ == "__main__":
    main(sys.argv[1])
