"""Two trees' ``--quick`` benchmark runs, compared leaf by leaf: did a refactor change a result?

Usage: python benchmarks/quick_compare.py BEFORE_DIR AFTER_DIR [--rerun RERUN_DIR] [--out FILE]

Each directory holds one tree's quick runs (``make bench-quick``-style ``--out DIR``). For every
JSON both hold, every leaf is classed as

- ``equal``;
- ``timing``: a wall-clock measurement or a ratio of them (its key names a time, rate, speed,
  ratio, load, overhead, idle or efficiency figure, or a ``samples`` / RSS measurement): not
  comparable between two runs, reported as a count;
- ``curve``: a learning curve (``rewards[i]``, ``reward_by_step[i]``, ``steps[i].reward_mean``):
  compared by the first step at which the two runs differ (None: not within the shorter run). The streaming
  fits are not bitwise reproducible (completion order changes the summation order), so ``--rerun`` (a second
  run of the BEFORE tree) gives the same first-divergence step between two runs of one tree: AFTER
  matches when it diverges no earlier;
- ``other``: everything else (settings, planned bytes, targets met); listed.

Writes the summary as JSON (default: BEFORE_DIR/../quick_compare.json) and prints a line per file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

TIMING = re.compile(
    r"(_s(?=_|$|\b|\.)|seconds|time|wall|period|speed|per_s|_ms|ms_per|load|efficiency|idle|mfu|flops|"
    r"overhead|ratio|_over|rate|busy|bound|gap|samples|measured|rss|peak_bytes|waited|backward_by_path"
    r"|git_commit|command|dirty)",
    re.I,
)
CURVE = re.compile(
    r"^(?P<run>.*?)(?:\.rewards\[(?P<i>\d+)\]|\.reward_by_step\[(?P<k>\d+)\]|\.steps\[(?P<j>\d+)\]\.reward_mean)$"
)


def leaves(x: Any, path: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(x, dict):
        for k, v in x.items():
            out.update(leaves(v, f"{path}.{k}" if path else str(k)))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            out.update(leaves(v, f"{path}[{i}]"))
    else:
        out[path] = x
    return out


def curves(flat: dict[str, Any]) -> dict[str, list[Any]]:
    found: dict[str, dict[int, Any]] = {}
    for key, value in flat.items():
        m = CURVE.match(key)
        if m is not None:
            found.setdefault(m["run"], {})[int(m["i"] or m["j"] or m["k"])] = value
    return {run: [steps[i] for i in sorted(steps)] for run, steps in found.items()}


def first_divergence(a: list[Any], b: list[Any]) -> int | None:
    """The first step at which two curves differ (None: equal over the shorter one)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def compare(before: Path, after: Path, rerun: Path | None) -> dict[str, Any]:
    files: dict[str, Any] = {}
    for path in sorted(after.glob("*.json")):
        if not (before / path.name).exists():
            continue
        a, b = leaves(json.loads((before / path.name).read_text())), leaves(json.loads(path.read_text()))
        other, counts = [], {"equal": 0, "timing": 0, "curve": 0, "other": 0}
        for key in sorted(set(a) & set(b)):
            kind = (
                "equal"
                if a[key] == b[key]
                else "curve"
                if CURVE.match(key)
                else "timing"
                if TIMING.search(key)
                else "other"
            )
            counts[kind] += 1
            if kind == "other":
                other.append({"key": key, "before": a[key], "after": b[key]})
        entry: dict[str, Any] = {**counts, "other_leaves": other, "one_side_only": sorted(set(a) ^ set(b))}
        ca, cb = curves(a), curves(b)
        again = rerun / path.name if rerun is not None else None
        cr = curves(leaves(json.loads(again.read_text()))) if again is not None and again.exists() else None
        if ca:
            entry["curves"] = {
                run: {
                    "first_divergence_after": first_divergence(ca[run], cb.get(run, [])),
                    "first_divergence_rerun": "no rerun"
                    if cr is None
                    else first_divergence(ca[run], cr.get(run, [])),
                    "steps": [len(ca[run]), len(cb.get(run, []))],
                }
                for run in ca
            }
        files[path.name] = entry
    return files


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rerun", type=Path, default=None, help="a second run of the BEFORE tree")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--note", default="", help="what BEFORE and AFTER are (commits, machine, load)")
    args = parser.parse_args(argv)
    files = compare(args.before, args.after, args.rerun)
    summary = {
        "command": " ".join(
            ["python", "benchmarks/quick_compare.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "before": str(args.before),
        "after": str(args.after),
        "rerun": str(args.rerun) if args.rerun else None,
        "note": args.note,
        "files": files,
    }
    out = args.out or args.before.parent / "quick_compare.json"
    out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    for name, e in files.items():
        div = ""
        if "curves" in e:
            div = "; curves first differ at " + ", ".join(
                f"{c['first_divergence_after']} (rerun {c['first_divergence_rerun']})"
                for c in e["curves"].values()
            )
        print(
            f"{name}: {e['equal']} equal, {e['timing']} timing, {e['curve']} curve, {e['other']} other{div}"
        )
        for leaf in e["other_leaves"]:
            print(f"    {leaf['key']}: {leaf['before']} -> {leaf['after']}")
    print(f"wrote {out}")
    return summary


if __name__ == "__main__":
    main()
