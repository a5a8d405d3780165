"""``overlap.py``'s figure: each mode's rollouts and learner intervals over two measured steps."""

from __future__ import annotations

import argparse

from _harness import MODES, schedule_index, trace_schedule

__all__ = ["timeline_png"]


def timeline_png(
    path: str, blocks: dict[str, dict], args: argparse.Namespace, time_scale_s: float, results: dict
) -> None:
    """One row per mode: each trajectory's rollout (generation, then verdict wait) above, the
    learner's busy intervals below (white gaps = idle), for two consecutive measured steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    kind_colors = {
        "backward": "tab:green",
        "fold": "tab:olive",
        "barrier": "tab:red",
        "optimizer": "tab:purple",
        "publish": "tab:brown",
    }
    first = max(1, args.warmup)
    shown = list(range(first, min(first + 2, args.steps)))
    fig, axes = plt.subplots(len(MODES), 1, figsize=(12, 2.6 * len(MODES)), sharex=True, dpi=100)
    xmax = 0.0
    xmin = 0.0
    for ax, mode in zip(axes, MODES):
        steps = blocks[mode]["steps"]
        t0 = steps[shown[0] - 1].step_end  # the previous step's end: where the first shown step begins
        n_traj = args.groups * args.group_size
        lane = 0
        for k in shown:
            s = steps[k]
            sched = trace_schedule(args.trace, blocks[mode]["seed"], s.step, args.groups, args.group_size)
            recs = sorted(s.trajectories, key=lambda r: r.reward_ready_at or r.content_ready_at)
            for j, r in enumerate(recs):
                gen_units = sched[schedule_index(r.trajectory_id, args.group_size)][0]
                y = 1.0 + lane + (j + 0.5) / n_traj
                gen0 = r.content_ready_at - gen_units * time_scale_s - t0
                xmin = min(xmin, gen0)
                ax.hlines(y, gen0, r.content_ready_at - t0, color="tab:blue", linewidth=0.6, alpha=0.8)
                if r.reward_ready_at is not None:
                    ax.hlines(
                        y,
                        r.content_ready_at - t0,
                        r.reward_ready_at - t0,
                        color="tab:orange",
                        linewidth=0.6,
                        alpha=0.8,
                    )
            lane += 1
            ax.axvline(s.step_end - t0, color="k", linestyle=":", linewidth=0.8)
            for iv in s.busy:
                ax.broken_barh(
                    [(iv.start - t0, iv.seconds)], (0.1, 0.7), color=kind_colors.get(iv.kind, "gray")
                )
            xmax = max(xmax, s.step_end - t0)
        ax.broken_barh(
            [(0, steps[shown[-1]].step_end - t0)],
            (0.1, 0.7),
            facecolor="none",
            edgecolor="0.6",
            hatch="//",
            linewidth=0.3,
            zorder=0,
        )
        r = results["modes"][mode]
        ax.set_yticks([0.45, 2.0], ["learner", "rollouts"])
        ax.set_ylim(0, 3.1)
        ax.set_title(
            f"{mode}: median step {r['median_step_s']:.2f} s, learner idle {r['learner_idle_fraction']:.0%}, "
            f"MFU {r['mfu']:.1%}, staleness max {r['staleness_max']}",
            fontsize=9,
            loc="left",
        )
    axes[-1].set_xlim(xmin - 0.01 * xmax, xmax * 1.01)
    axes[-1].set_xlabel(
        "seconds from the end of the step before (two consecutive steps; dotted: step end; hatched: learner "
        "idle; async's rollouts start before 0: issued one step ahead)"
    )
    handles = [
        Patch(color="tab:blue", label="generation (content ready)"),
        Patch(color="tab:orange", label="verdict wait (reward ready)"),
        *[Patch(color=c, label=k) for k, c in kind_colors.items()],
    ]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=7, fontsize=7)
    fig.suptitle(
        f"streaming {results['speedup_streaming_vs_sync']:.2f}x sync, async "
        f"{results['speedup_async_vs_sync']:.2f}x, bound {results['bound_speedup']:.2f}x, efficiency "
        f"{results['efficiency']:.2f} (trace {args.trace}, {args.groups}x{args.group_size}, 1 unit "
        f"= {time_scale_s * 1e3:.1f} ms)",
        fontsize=10,
        x=0.01,
        ha="left",
    )
    fig.tight_layout(rect=(0, 0, 1, 0.91))
    fig.savefig(path)
    plt.close(fig)
