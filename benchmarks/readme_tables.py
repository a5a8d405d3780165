"""The result tables of README.md and benchmarks/README.md, rendered from benchmarks/results/*.json.

A table lives in a Markdown file between ``<!-- table: NAME -->`` and ``<!-- /table -->``; its body
is exactly ``render(NAME)``, so every figure it shows is read from the results file its row links.
tests/benchmarks/test_readme_tables.py checks that every marked table equals its rendering.

    .venv/bin/python benchmarks/readme_tables.py           # rewrite the marked tables in place
    .venv/bin/python benchmarks/readme_tables.py --check   # exit 1 if a table differs from its JSON
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FILES = (ROOT / "README.md", ROOT / "benchmarks" / "README.md")
MARKED = re.compile(r"<!-- table: (?P<name>[a-z0-9_]+) -->\n(?P<body>.*?)<!-- /table -->", re.S)

Renderer = Callable[[Callable[[str], dict[str, Any]], str], str]
TABLES: dict[str, Renderer] = {}


def table(name: str) -> Callable[[Renderer], Renderer]:
    def register(fn: Renderer) -> Renderer:
        TABLES[name] = fn
        return fn

    return register


def grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x"


def f2(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def s(v: float | None) -> str:
    return "never" if v is None else f"{v:.0f} s"


def met(flags: dict[str, bool]) -> str:
    return "yes" if all(flags.values()) else "no: " + ", ".join(k for k, ok in flags.items() if not ok)


def link(name: str, prefix: str) -> str:
    return f"[{name}.json]({prefix}{name}.json)"


def deepest_dip(curve: Sequence[Sequence[float]]) -> tuple[int, float, float] | None:
    """(step, value, best value before it) of the point furthest below the curve's running best."""
    best, found = curve[0][1], None
    for step, value in curve[1:]:
        if value < best and (found is None or best - value > found[2] - found[1]):
            found = (int(step), value, best)
        best = max(best, value)
    return found


# --- README.md ----------------------------------------------------------------------------------


@table("headline")
def headline(load: Callable[[str], dict[str, Any]], prefix: str) -> str:
    demo = load("demo")["summary"]
    code = load("code_learn")["curves"]["val/pass_at_1"]
    dip = deepest_dip(code)
    tools = load("tool_learn")["summary"]
    ended = load("tool_learn")["ended_turn_fraction"]
    short, long_ = load("overlap"), load("overlap_long")
    ttt = load("time_to_target")["median_seconds"]["toy"]
    bf16 = load("bf16_gradient")["streaming_vs_sync"]
    rows = [
        ("`make demo`: toy game, 300 steps of 16 x 8",
         f"mean reward {demo['reward_mean_first']:.2f} -> {demo['reward_mean_last']:.2f}, staleness "
         f"{demo['staleness_max']}, fit {demo['wall_seconds'] / 60:.1f} min at load "
         f"{load('demo')['load_average_start'][0]:.0f}-{load('demo')['load_average_end'][0]:.0f}", "demo"),
        ("`make demo-code`: held-out pass@1, 100 steps",
         f"{code[0][1]:.2f} -> {code[-1][1]:.2f}"
         + (f" (dips to {dip[1]:.2f} at step {dip[0]} from {dip[2]:.2f})" if dip else " (never dips)"),
         "code_learn"),
        ("`make demo-tools`: held-out pass@1 through native tool calls, "
         f"{tools['steps']} steps",
         f"{tools['val_pass_at_1_first']:.2f} -> {tools['val_pass_at_1_last']:.2f}; "
         f"actions that ended their turn {100 * ended['first']:.1f}% -> {100 * ended['last']:.1f}% "
         f"(first and last {ended['window_steps']} steps); fit {tools['wall_seconds'] / 60:.1f} min at load "
         f"{load('tool_learn')['machine']['load_average_1m_5m_15m'][2]:.0f} (15-min mean)", "tool_learn"),
        ("step time, streaming over sync, short workload (2.4M params)",
         f"{x(short['speedup_streaming_vs_sync'])} (bound {x(short['bound_speedup'])}; one-step async "
         f"{x(short['speedup_async_vs_sync'])} at staleness 1)", "overlap"),
        ("step time, streaming over sync, long workload (20M params)",
         f"{x(long_['speedup_streaming_vs_sync'])} (bound {x(long_['bound_speedup'])}; one-step async "
         f"{x(long_['speedup_async_vs_sync'])})", "overlap_long"),
        ("seconds to a reward of 0.9, toy (median of 3 seeds)",
         f"streaming {s(ttt['streaming'])}, sync {s(ttt['sync'])}, async {s(ttt['async'])}, "
         f"async + importance correction {s(ttt['async_is'])}", "time_to_target"),
        ("first step's gradient, streaming vs sync (relative L2)",
         f"fp32 {bf16['32-true']:.0e}, bf16-true {bf16['bf16-true']:.1%}", "bf16_gradient"),
    ]  # fmt: skip
    return grid(("what", "result", "file"), [(w, r, link(n, prefix)) for w, r, n in rows])


@table("exactness")
def exactness(load: Callable[[str], dict[str, Any]], prefix: str) -> str:
    d = load("bf16_gradient")["streaming_vs_sync"]
    return ("Measured on the first step's gradient, streaming vs sync: "
            f"{d['32-true']:.1e} relative in fp32 (float\n"
            f"rounding only), {d['bf16-true']:.2%} in `bf16-true` "
            "(each trajectory's gradient is rounded in bf16\n"
            f"before the fp32 sums) ({link('bf16_gradient', prefix)}).\n")  # fmt: skip


@table("vs_trl_sentence")
def vs_trl_sentence(load: Callable[[str], dict[str, Any]], prefix: str) -> str:
    d = load("vs_trl")
    r = d["tasks"]["single"]["ratios"]
    load_avg = d["loaded_machine"]["load_average_start"][0]
    return ("Against TRL 1.16's `GRPOTrainer` on the same single-turn task, tiny Qwen3, "
            "reward and batch (CPU, 8 x 8\n"
            "completions of 16 tokens a step): a step takes "
            f"{x(r['streaming_over_trl']['step_paired_median'])} TRL's time streaming, "
            f"{x(r['sync_over_trl']['step_paired_median'])} sync,\n"
            f"and {x(r['streaming_over_trl']['cpu_paired_median'])} / "
            f"{x(r['sync_over_trl']['cpu_paired_median'])} its CPU seconds "
            f"(measured at load {load_avg:.0f} on 2 cores; {link('vs_trl', prefix)}).\n")  # fmt: skip


# --- benchmarks/README.md -----------------------------------------------------------------------

OVERLAP = ("overlap", "overlap_repeat", "overlap_short_paths", "overlap_auto", "overlap_forward_tokens_0",
           "overlap_rollout_bound", "overlap_long", "overlap_long_quick", "overlap_long_4steps")  # fmt: skip


@table("overlap")
def overlap(load: Callable[[str], dict[str, Any]], prefix: str) -> str:
    rows = []
    for name in OVERLAP:
        d = load(name)
        modes = d["modes"]
        rows.append((link(name, prefix), d["workload_name"] + (" quick" if d.get("quick") else ""),
                     x(d["speedup_streaming_vs_sync"]), x(d["bound_speedup"]), f2(d["efficiency"]),
                     x(d["speedup_async_vs_sync"]), pct(modes["sync"]["learner_idle_fraction"]),
                     pct(modes["streaming"]["learner_idle_fraction"]), met(d["targets_met"])))  # fmt: skip
    header = ("file", "workload", "streaming / sync", "bound", "efficiency", "async / sync", "sync idle",
              "streaming idle", "targets met")  # fmt: skip
    return grid(header, rows)


TIME_TO_TARGET = ("time_to_target", "time_to_target_balanced_factors", "time_to_target_balanced_no_split")


@table("time_to_target")
def time_to_target(load: Callable[[str], dict[str, Any]], prefix: str) -> str:
    rows = []
    for name in TIME_TO_TARGET:
        d = load(name)
        for workload, modes in d["workloads"].items():
            cell = {m: modes["modes"].get(m) for m in ("sync", "streaming", "async", "async_is")}
            stream = cell["streaming"] or {}
            rows.append((link(name, prefix), workload,
                         *(f"{s(v['median_seconds'])} ({v['reached']})" if v else "—" for v in cell.values()),
                         f"{f2(stream.get('step_median_over_sync_step'))} / "
                         f"{f2(stream.get('release_floor_over_sync_step'))}",
                         met(modes.get("targets_met", {}))))  # fmt: skip
    header = ("file", "workload", "sync", "streaming", "async", "async + IS",
              "streaming step / sync step (floor)", "targets met")  # fmt: skip
    return grid(header, rows)


VS_TRL_NAMES = {"trl": "TRL 1.16", "streaming": "streaming", "sync": "sync"}


@table("vs_trl")
def vs_trl(load: Callable[[str], dict[str, Any]], prefix: str) -> str:
    d = load("vs_trl")
    rows = []
    for kind, task in d["tasks"].items():
        for config, c in task["configs"].items():
            over = task["ratios"].get(f"{config}_over_trl", {})
            rows.append((kind, VS_TRL_NAMES[config],
                         f"{c['step_s_median']:.3f}", x(over.get("step_paired_median", 1.0)),
                         f"{c['cpu_s_per_step_median']:.3f}", x(over.get("cpu_paired_median", 1.0)),
                         f"{c['tokens_per_step_median']:.0f}", f2(c["reward_last10"]),
                         f"{s(c['seconds_to_target_median'])} ({c['target_reached']})"))  # fmt: skip
    header = ("task", "trainer", "step (s)", "step / TRL", "CPU s / step", "CPU / TRL", "tokens / step",
              "reward, last 10 steps", f"to reward {d['settings']['target']} (reached)")  # fmt: skip
    targets = [
        f"{name} {f2(t['value'])} (limit {t['limit']}): {'met' if t['met'] else 'missed'}"
        for name, t in d["tasks"]["single"]["targets"].items()
        if "limit" in t
    ]
    la = d["loaded_machine"]
    return grid(header, rows) + (
        f"\nSingle-turn targets: {'; '.join(targets)}. Load average {la['load_average_start'][0]:.1f} "
        f"at the start, {la['load_average_end'][0]:.1f} at the end ({link('vs_trl', prefix)}; "
        f"{len(d['settings']['seeds'])} seeds, {d['settings']['steps']} + {d['settings']['tool_steps']} "
        "steps).\n")  # fmt: skip


LEARNING_TARGET = 0.6


def learning_curve(name: str, load: Callable[[str], dict[str, Any]]) -> str:
    """A learning demo's held-out curve (``code_learn_curve.py --name NAME``) and its target."""
    curves = load(name)["curves"]
    at_k = dict(curves["val/pass_at_k"])
    curve = curves["val/pass_at_1"]
    first = curve[0][1]
    reached = next((step for step, p in curve if p >= max(LEARNING_TARGET, 2 * first)), None)
    verdict = f"met at step {reached}" if reached is not None else "not met"
    header = ("step", *(str(step) for step, _ in curve))  # one column per evaluation
    rows = [
        ("held-out pass@1", *(f2(p) for _, p in curve)),
        ("held-out pass@k", *(f2(at_k.get(step)) for step, _ in curve)),
    ]
    ended = load(name).get("ended_turn_fraction")
    turns = (
        ""
        if ended is None
        else (
            "\nActions that ended their turn (end-of-turn token within `max_action_tokens`), mean of the "
            f"first and last {ended['window_steps']} training steps: "
            f"{100 * ended['first']:.1f}% -> {100 * ended['last']:.1f}%.\n"
        )
    )
    return (
        grid(header, rows)
        + (f"\nTarget: held-out pass@1 >= {LEARNING_TARGET} and >= twice the first evaluation: {verdict}.\n")
        + turns
    )


@table("code_learn")
def code_learn(load: Callable[[str], dict[str, Any]], prefix: str) -> str:
    return learning_curve("code_learn", load)


@table("tool_learn")
def tool_learn(load: Callable[[str], dict[str, Any]], prefix: str) -> str:
    return learning_curve("tool_learn", load)


@table("demo")
def demo(load: Callable[[str], dict[str, Any]], prefix: str) -> str:
    d = load("demo")
    m = d["summary"]
    rows = [(link("demo", prefix), str(m["steps"]),
             f"{m['reward_mean_first']:.2f} -> {m['reward_mean_last']:.2f}",
             str(m["staleness_max"]), pct(m["learner_idle_fraction"]), f"{m['step_seconds_median']:.2f} s",
             f"{m['wall_seconds'] / 60:.1f} min",
             f"{d['load_average_start'][0]:.1f} -> {d['load_average_end'][0]:.1f}")]  # fmt: skip
    return grid(("file", "steps", "mean reward", "staleness", "learner idle", "median step", "fit",
                 "load average (1 min), start -> end"), rows)  # fmt: skip


@table("bf16")
def bf16(load: Callable[[str], dict[str, Any]], prefix: str) -> str:
    d = load("bf16_gradient")
    rows = [(link("bf16_gradient", prefix), f"{d['streaming_vs_sync']['32-true']:.1e}",
             f"{d['streaming_vs_sync']['bf16-true']:.2%}",
             " / ".join(f"{d['bf16_vs_fp32'][m]:.2%}" for m in ("streaming", "sync")))]  # fmt: skip
    return grid(
        (
            "file",
            "streaming vs sync, fp32",
            "streaming vs sync, bf16-true",
            "bf16 vs fp32 (streaming / sync)",
        ),
        rows,
    )


@table("split_backward")
def split_backward(load: Callable[[str], dict[str, Any]], prefix: str) -> str:
    rows = []
    for model, d in load("split_backward")["models"].items():
        rows.append((model, f"{d['parameters'] / 1e6:.2f}M", str(d["destinations"]),
                     x(d["separate_over_split_wall"]), x(d["split_dense_over_split_wall"]),
                     f"{max(d['gradient_rel_diff_vs_per_job'].values()):.0e}"))  # fmt: skip
    header = ("model", "parameters", "destinations", "separate calls / split", "dense sums / factor sums",
              "gradient rel. diff")  # fmt: skip
    return link("split_backward", prefix) + "\n\n" + grid(header, rows)


@table("others")
def others(load: Callable[[str], dict[str, Any]], prefix: str) -> str:
    """One line per remaining benchmark: its headline ratio and whether its target is met."""
    cut = load("boundary_cut")
    mem = load("memory")["summary"]
    opd = load("opd")["summary"]
    calls = load("learner_calls_paired")["modes"]
    start = load("engine_start")["spawn_over_forkserver"]
    soak = load("soak")
    cap = load("token_cap")["settings"]
    core = load("core_overhead")["results"]
    eff = load("sample_efficiency")
    server = load("vllm_server")
    rows = [
        ("boundary_cut", f"learner CPU per step uncut / cut {x(cut['learner_work_ratio_cpu'])}, "
         f"gradient rel. diff {cut['gradient_rel_diff']:.0e}",
         f">= {cut['target_ratio']}x: {'yes' if cut['target_met'] else 'no'}"),
        ("memory", "accounted / analytic accumulator bytes " + ", ".join(f"{k} {v:.2f}" for k, v in
         mem["accounted_over_analytic"].items()), "1.00: " + ("yes" if all(abs(v - 1) < 1e-9 for v in
         mem["accounted_over_analytic"].values()) else "no")),
        ("opd", f"to reward 0.9: OPD {opd['opd']['reached']} seeds "
         f"(median {opd['opd']['median_steps']} steps), GRPO {opd['grpo']['reached']}", "—"),
        ("learner_calls_paired", "step / sync's: " + ", ".join(f"{m} {v['step_over_sync']:.2f}" for m, v in
         calls.items() if m != "sync"), "—"),
        ("engine_start",
         f"spawn / forkserver: later starts {x(start['later_start'])}, restart {x(start['restart'])}", "—"),
        ("soak", f"{soak['steps']} steps: RSS {soak['delta']['rss_mb']:+.1f} MB, threads/fds/children/shm "
         f"{'flat' if soak['all_flat'] else 'growing'}", "flat: " + ("yes" if soak["all_flat"] else "no")),
        ("token_cap", "largest call's activations / plan: "
         + ", ".join(f"{k} {v['measured_over_planned']:.2f}" for k, v in cap.items()),
         "<= 1: " + ("yes" if all(v["measured_over_planned"] <= 1 for v in cap.values()) else "no")),
        ("core_overhead", "fold overhead per trajectory: "
         + ", ".join(f"offload {k} {v['wall']['overhead_per_trajectory']:.1%}" for k, v in core.items()),
         "<= 5%: " + ("yes" if all(v["wall"]["meets_target"] for v in core.values()) else "no")),
        ("sample_efficiency", f"{eff['steps']} steps, mean reward of the last 10: " + ", ".join(
         f"{m} {v['reward_last_10']:.2f}" for m, v in eff["modes"].items()), "—"),
        ("vllm_server",
         f"vLLM server engine / in-process, CPU: publish {server['publish_ratio']:.2f}x, per request "
         + ", ".join(f"{k} {v:.2f}x" for k, v in server["per_request_ratio"].items())
         + f" (same tokens: {'yes' if server['same_tokens'] else 'no'})", "—"),
    ]  # fmt: skip
    return grid(("file", "result", "target met"), [(link(n, prefix), r, t) for n, r, t in rows])


# --- plumbing -----------------------------------------------------------------------------------


def loader(results: Path) -> Callable[[str], dict[str, Any]]:
    def load(name: str) -> dict[str, Any]:
        return json.loads((results / f"{name}.json").read_text())

    return load


def prefix_for(path: Path, results: Path = RESULTS) -> str:
    """The relative link from the Markdown file to the results folder."""
    return Path(os.path.relpath(results, path.resolve().parent)).as_posix() + "/"


def render(name: str, path: Path, results: Path = RESULTS) -> str:
    if name not in TABLES:
        raise KeyError(f"unknown table {name!r}; known: {sorted(TABLES)}")
    return TABLES[name](loader(results), prefix_for(path, results))


def marked(text: str) -> Iterator[tuple[str, str]]:
    """(name, body) of every marked table in ``text``."""
    for m in MARKED.finditer(text):
        yield m.group("name"), m.group("body")


def rewrite(path: Path, results: Path = RESULTS) -> str:
    text = path.read_text()
    return MARKED.sub(
        lambda m: (
            f"<!-- table: {m.group('name')} -->\n{render(m.group('name'), path, results)}<!-- /table -->"
        ),
        text,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a marked table differs from its JSON")
    args = parser.parse_args(argv)
    stale = []
    for path in FILES:
        new = rewrite(path)
        if new != path.read_text():
            stale.append(path)
            if not args.check:
                path.write_text(new)
    for path in stale:
        print(f"{'stale' if args.check else 'rewrote'}: {path.relative_to(ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
