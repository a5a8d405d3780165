"""``overlap.py``'s lower bound of a step (see its module docstring for the formula)."""

from __future__ import annotations

import argparse
import statistics

from _harness import MODES, trace_schedule

__all__ = ["release_bound", "step_bounds", "trace_ceiling"]


def release_bound(arrivals: list[tuple[float, int]], time_scale_s: float, work_s: float) -> float:
    """Least time to finish a step's learner work when no trajectory can be worked on before its
    content lands: ``max_j (c_j s + W * tokens(c >= c_j) / tokens)`` over arrivals c_j (units, x s
    seconds), W the step's learner work split over trajectories in proportion to their tokens (the
    single-machine bound with release dates, every job at its cheapest measured rate)."""
    total = sum(n for _, n in arrivals)
    best, after = 0.0, total
    for c, n in sorted(arrivals):
        best = max(best, c * time_scale_s + work_s * after / total)
        after -= n
    return best


def trace_ceiling(trace: str, seed: int, groups: int, group_size: int, steps: int = 400) -> dict:
    """What the trace itself allows, in trace units over ``steps`` steps: a learner that spends one
    unit per trajectory (B*G units a step) and a perfect streaming learner (step = max(makespan,
    B*G units))."""
    makespans = [max(r for _, r in trace_schedule(trace, seed, k, groups, group_size)) for k in range(steps)]
    work = groups * group_size
    return {
        "steps": steps,
        "sync_idle_fraction_mean": statistics.mean(m / (m + work) for m in makespans),
        "median_ratio": statistics.median(m + work for m in makespans)
        / statistics.median(max(m, work) for m in makespans),
        "throughput_ratio": sum(m + work for m in makespans) / sum(max(m, work) for m in makespans),
        "mean_of_per_step_ratios": statistics.mean((m + work) / max(m, work) for m in makespans),
        "note": (
            "sync step = makespan + B*G units, perfect streaming step = "
            "max(makespan, B*G units), in trace units"
        ),
    }


def step_bounds(
    args: argparse.Namespace,
    rows: dict[str, list[dict]],
    single_s: float,
    time_scale_s: float,
    end_of_step: float,
    least_work: float,
) -> tuple[list, dict, dict, dict, dict]:
    """Per measured (seed, step): the bound (``overlap.py``'s docstring), the bound without release
    dates (one W for every step), and the per-step figures of every mode; every mode must have run
    the same (seed, step) workloads."""
    measured = [(r["seed"], r["step"]) for r in rows["streaming"]]
    for m in MODES:
        assert sorted((r["seed"], r["step"]) for r in rows[m]) == sorted(measured), (
            "modes ran different workloads"
        )
    makespans = {
        key: max(r for _, r in trace_schedule(args.trace, key[0], key[1], args.groups, args.group_size))
        for key in measured
    }
    arrivals = {(r["seed"], r["step"]): r["arrivals"] for r in rows["streaming"]}

    def per_key(mode: str, field: str) -> dict:
        return {
            key: statistics.mean(r[field] for r in rows[mode] if (r["seed"], r["step"]) == key)
            for key in makespans
        }

    busy = {m: per_key(m, "busy_s") for m in MODES}
    period = {m: per_key(m, "period_s") for m in MODES}
    # this step's learner work, the cheaper of the two ways measured on it
    work = {key: min(busy["sync"][key], busy["streaming"][key]) for key in makespans}
    loose = {key: max(m * time_scale_s + single_s + end_of_step, least_work) for key, m in makespans.items()}
    # the last reward needs no backward of its own when its content landed earlier (only a fold):
    # the release-date term covers every trajectory's work after its content lands
    release = {key: release_bound(arrivals[key], time_scale_s, work[key]) for key in makespans}
    bounds = {key: max(makespans[key] * time_scale_s, release[key]) + end_of_step for key in makespans}
    per_step = {
        f"seed{key[0]}-step{key[1]}": {
            "makespan_units": makespans[key],
            "bound_s": bounds[key],
            "bound_without_release_dates_s": loose[key],
            "release_bound_s": release[key],
            "learner_work_s": work[key],
            **{f"{m}_busy_s": busy[m][key] for m in MODES},
            **{f"{m}_s": period[m][key] for m in MODES},
        }
        for key in sorted(set(measured))
    }
    return measured, makespans, bounds, loose, per_step
