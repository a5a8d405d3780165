"""Overhead of streaming GRPO's fold relative to a plain backward, per trajectory, on CPU.

For a randomly initialised transformers Qwen3 of >= 10M parameters, each trajectory (T tokens,
the first quarter an unscored prompt) is forwarded twice; one copy is backpropagated the plain
way, ``(-S).backward()`` into ``.grad``, the other goes through ``StreamingGRPO`` (``add_logprob``
and the ``add_reward`` calls that fold it). The two are timed side by side, in alternating order,
in the same run, and medians are reported. Forward passes are not timed.

One step = one group of six trajectories with binary rewards, events in an order that visits every
path of the accumulator once per step:

    t0 logprob      held      (reward unknown: flatten and keep)
    t0 reward       fold-held (fold the held gradient into its reward's sum)
    t1 reward, t1 logprob     sum-new (reward known: flatten, the first sum of that reward)
    t2 reward, t2 logprob     sum-add (reward known: flatten, add into the existing sum)
    t3 logprob, t3 reward     held, fold-held (add into the sum)
    t4 reward, t5 reward      fold-group (all rewards known: fold both sums into the step gradient)
    t4 logprob, t5 logprob    direct (backward weighted by A_i straight into the step gradient)
    finish                    the barrier: add the step gradient to .grad (once per step)

Overhead = (time of the accumulator's calls for the group) / (time of the six plain backwards) - 1;
the target is <= 5%. ``finish`` runs once per optimizer step, not per trajectory: it is reported
separately (ms, and as a fraction of one backward). A component profile (autograd.grad vs
backward, flatten/cat, add_) explains where the time goes.

Both clocks are recorded: wall time and process CPU time (user + system). On a shared machine CPU
time is the steadier one, but only with one thread (``--threads 1``, the default): with more, idle
OpenMP workers spin while they wait and bill CPU time that depends on the other jobs.

Usage: python benchmarks/core_overhead.py [--quick] [--out DIR] [--threads N]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import add_common_args, median, summary, timed_cpu, write_bar_chart, write_result  # noqa: E402
from thundersync_lightning.core import StreamingGRPO  # noqa: E402

NAME = "core_overhead"
TARGET = 0.05
REWARDS = (1.0, 0.0, 1.0, 0.0, 1.0, 0.0)
# (event, trajectory index, path label); the label names what the timed call does.
SCHEDULE = (
    ("logprob", 0, "held"),
    ("reward", 0, "fold-held"),
    ("reward", 1, None),
    ("logprob", 1, "sum-new"),
    ("reward", 2, None),
    ("logprob", 2, "sum-add"),
    ("logprob", 3, "held"),
    ("reward", 3, "fold-held"),
    ("reward", 4, None),
    ("reward", 5, "fold-group"),
    ("logprob", 4, "direct"),
    ("logprob", 5, "direct"),
)
LOGPROB_PATHS = ("held", "sum-new", "sum-add", "direct")


def build_policy(args: argparse.Namespace) -> tuple[torch.nn.Module, dict]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = dict(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=max(1024, args.tokens),
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**config, attn_implementation="sdpa")).eval()
    return model, config


def make_trajectory(vocab: int, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, tokens), generator=gen)  # (1, T)
    scored = torch.zeros(tokens - 1, dtype=torch.bool)  # (T-1,): targets ids[1:]
    scored[tokens // 4 :] = True  # the first quarter is an unscored prompt
    return ids, scored


def score(model: torch.nn.Module, trajectory: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """S_i = sum of the scored tokens' log-probabilities (a scalar with a graph to the weights)."""
    ids, scored = trajectory
    logits = model(input_ids=ids).logits[0, :-1]  # (T-1, V)
    logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None]).squeeze(1)  # (T-1,)
    return logp[scored].sum()


def one_step(acc: StreamingGRPO, model, trajectories, stream_first: bool) -> dict:
    """One group through the accumulator and the same six trajectories through plain backward.

    The accumulator is reused across steps with ``reset()`` (as the strategy does), so its gradient
    buffers come from its free list, as in a training run's steady state.
    """
    acc.reset()
    ids = [f"t{i}" for i in range(len(REWARDS))]
    acc.open_group("g", ids)
    calls: list[tuple[str, float, float]] = []  # (label, wall s, cpu s)
    baseline: list[tuple[float, float]] = []

    def plain(i: int) -> None:
        loss = -score(model, trajectories[i])
        baseline.append(timed_cpu(loss.backward)[:2])

    for event, i, label in SCHEDULE:
        if event == "reward":
            wall, cpu, _ = timed_cpu(functools.partial(acc.add_reward, ids[i], REWARDS[i]))
        else:
            if not stream_first:
                plain(i)
            call = functools.partial(acc.add_logprob, ids[i], score(model, trajectories[i]))
            wall, cpu, _ = timed_cpu(call)
            del call  # frees the graph's saved tensors before the next forward
            if stream_first:
                plain(i)
        calls.append((label or "reward", wall, cpu))
    finish_wall, finish_cpu, report = timed_cpu(acc.finish)
    return {
        "calls": calls,
        "baseline": baseline,
        "finish": (finish_wall, finish_cpu),
        "peak_bytes": report.peak_bytes,
        "backward_passes": report.backward_passes,
    }


def profile_components(model, params, trajectories) -> dict:
    """Where the accumulator's time goes, measured on the same trajectories, interleaved."""
    keys = ("backward", "autograd_grad", "flatten_cat", "flat_add", "foreach_add_into_flat_views")
    wall: dict[str, list[float]] = {k: [] for k in keys}
    cpu: dict[str, list[float]] = {k: [] for k in keys}

    def record(key, fn):
        w, c, result = timed_cpu(fn)
        wall[key].append(w)
        cpu[key].append(c)
        return result

    flat_buf = torch.zeros(sum(p.numel() for p in params))
    views = list(flat_buf.split([p.numel() for p in params]))
    for traj in trajectories:
        record("backward", (-score(model, traj)).backward)
        grads = record("autograd_grad", functools.partial(torch.autograd.grad, score(model, traj), params))
        parts = [g.reshape(-1) for g in grads]
        flat = record("flatten_cat", functools.partial(torch.cat, parts))
        record("flat_add", functools.partial(flat_buf.add_, flat))
        record("foreach_add_into_flat_views", functools.partial(torch._foreach_add_, views, parts))
    return {"wall": {k: summary(v) for k, v in wall.items()}, "cpu": {k: summary(v) for k, v in cpu.items()}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, default_threads=1)
    parser.add_argument("--reps", type=int, default=None, help="steps per offload mode (default 12, quick 3)")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per trajectory")
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--intermediate", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--offloads", nargs="+", default=["none", "cpu"])
    args = parser.parse_args(argv)
    reps = args.reps if args.reps is not None else (3 if args.quick else 12)
    torch.set_num_threads(args.threads)

    model, config = build_policy(args)
    for p in model.parameters():  # .grad exists from the start: plain backward accumulates into it
        p.grad = torch.zeros_like(p)
    params = list(model.parameters())
    num_params = sum(p.numel() for p in params)
    trajectories = [make_trajectory(args.vocab, args.tokens, seed) for seed in range(len(REWARDS))]

    accumulators = {mode: StreamingGRPO(params, "grpo", offload=mode) for mode in args.offloads}
    for acc in accumulators.values():  # warm-up (fills each free list), not recorded
        one_step(acc, model, trajectories, stream_first=False)
    steps: dict[str, list[dict]] = {mode: [] for mode in args.offloads}
    for rep in range(reps):  # modes interleaved rep by rep; stream/plain order alternates
        for k, mode in enumerate(args.offloads):
            steps[mode].append(
                one_step(accumulators[mode], model, trajectories, stream_first=(rep + k) % 2 == 1)
            )
            print(f"rep {rep + 1}/{reps} offload={mode}", file=sys.stderr, flush=True)
    profile = profile_components(model, params, trajectories[: 2 if args.quick else 6])

    results = {}
    for mode, records in steps.items():
        peak = records[-1]["peak_bytes"]
        results[mode] = {
            "peak_bytes": {
                "device": peak.device,
                "pinned_host": peak.pinned_host,
                "pageable_host": peak.pageable_host,
            },
            "backward_passes_per_step": records[-1]["backward_passes"],
        }
        for clock, k in (("wall", 1), ("cpu", 2)):
            backward = median(b[k - 1] for r in records for b in r["baseline"])
            per_path = {
                label: median(c[k] for r in records for c in r["calls"] if c[0] == label)
                for label in (*LOGPROB_PATHS, "fold-held", "fold-group", "reward")
            }
            paired = [
                sum(c[k] for c in r["calls"]) / sum(b[k - 1] for b in r["baseline"]) - 1.0 for r in records
            ]
            finish = median(r["finish"][k - 1] for r in records)
            results[mode][clock] = {
                "overhead_per_trajectory": median(paired),  # median over steps of (stream / plain - 1)
                "overhead_per_trajectory_per_step": paired,
                "meets_target": median(paired) <= TARGET,
                "plain_backward_s": backward,
                "calls_median_s": per_path,
                "logprob_overhead_vs_backward": {p: per_path[p] / backward - 1.0 for p in LOGPROB_PATHS},
                "finish_s": finish,
                "finish_vs_one_backward": finish / backward,
            }

    payload = {
        "description": "add_logprob + fold per trajectory vs plain loss.backward() into .grad, CPU",
        "target_overhead": TARGET,
        "model": {"type": "qwen3", "config": config, "num_params": num_params, "dtype": "float32"},
        "tokens_per_trajectory": args.tokens,
        "scored_tokens_per_trajectory": int(trajectories[0][1].sum()),
        "group_rewards": list(REWARDS),
        "schedule": [list(e) for e in SCHEDULE],
        "reps": reps,
        "threads": args.threads,
        "quick": args.quick,
        "results": results,
        "profile_s": profile,
        "profile_buffer_bytes": num_params * 4,
    }
    path = write_result(args.out, NAME, payload)
    chart = {
        f"{mode} ({clock})": {
            "plain backward": r[clock]["plain_backward_s"] * 1e3,
            **{f"add_logprob ({p})": r[clock]["calls_median_s"][p] * 1e3 for p in LOGPROB_PATHS},
            "add_reward (fold group)": r[clock]["calls_median_s"]["fold-group"] * 1e3,
        }
        for mode, r in results.items()
        for clock in ("wall", "cpu")
    }
    title = (
        f"Qwen3 {num_params / 1e6:.1f}M params, {args.tokens} tokens, {args.threads} thread(s); overhead "
        + ", ".join(
            f"{m} {r['wall']['overhead_per_trajectory']:+.1%} wall / "
            f"{r['cpu']['overhead_per_trajectory']:+.1%} cpu"
            for m, r in results.items()
        )
    )
    write_bar_chart(path.with_suffix(".png"), chart, ylabel="median ms per call", title=title)
    for mode, r in results.items():
        for clock in ("wall", "cpu"):
            c = r[clock]
            print(
                f"offload={mode} [{clock}]: overhead {c['overhead_per_trajectory']:+.2%} per trajectory "
                f"(plain backward {c['plain_backward_s'] * 1e3:.0f} ms; "
                + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in c["calls_median_s"].items())
                + f"; finish {c['finish_s'] * 1e3:.1f} ms)"
            )
    for clock in ("wall", "cpu"):
        print(
            f"profile [{clock}] (median ms): "
            + ", ".join(f"{k} {v['median'] * 1e3:.1f}" for k, v in profile[clock].items())
        )
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return payload


if __name__ == "__main__":
    main()
