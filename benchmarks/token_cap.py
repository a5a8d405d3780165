"""What a learner call holds, cut by rows or by tokens: ``ThunderSyncStrategy(max_batch_tokens=...)``.

A call keeps every micro-batch's graph until its one backward, so its activations grow with its
tokens, not its rows. Workload: one step's 64 trajectories (8 groups of 8) of agent-like lengths,
log-uniform over 32-1024 tokens, in landing order, on a 2-layer Qwen3 (hidden 256) in float32;
every reward known, so each call is one direct ``add_tokens`` through ``score_tokens``, the path
the synchronous learner and streaming's direct calls take. Settings: the default row cap
(``max_batch_trajectories=32``), a tight row cap (8), and token caps of 4096 and 8192 tokens (rows
uncapped). Per setting, with the strategy's own cut (``strategy.batching.call_size``):

- calls, and the largest call's real and padded tokens (``score_tokens``' micro-batches);
- the largest call's activations as saved for backward (``torch.autograd.graph.saved_tensors_hooks``:
  every distinct storage a forward saves, the parameters excluded), against the memory plan's row
  for the same settings (``PlanInputs`` with T = 1024): ``measured_over_planned`` <= 1 means the plan
  bounds what the call held; ``measured_bytes_per_padded_token`` (the largest over calls) against
  the plan's per-token estimate ``planned_bytes_per_token`` checks the estimate itself;
- wall and process CPU seconds for the whole step (interleaved repeats, medians) and tokens per
  second relative to the default (``speed_over_default``: above 1, faster).

``padding_mask``: the largest 8-row call run forward and backward with an explicit padding mask
(what the policy passed before) and without one (what it runs now: right padding needs none):
saved bytes and seconds, and their ratios.

    python benchmarks/token_cap.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_common_args, median, timed_cpu, write_bar_chart, write_result  # noqa: E402
from _harness import direct_accumulator, load_average, qwen3_config  # noqa: E402
from thundersync_lightning.core.types import Segment, Trajectory  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy  # noqa: E402
from thundersync_lightning.planning.memory_plan import Architecture, ModelShape, PlanInputs, plan_memory  # noqa: E402
from thundersync_lightning.strategy.batching import call_size  # noqa: E402

NAME = "token_cap"
LONGEST, SHORTEST, PROMPT = 1024, 32, 16
#: (label, max_batch_trajectories, max_batch_tokens)
SETTINGS = (
    ("rows 32 (default)", 32, None),
    ("rows 8", 8, None),
    ("tokens 4096", 64, 4096),
    ("tokens 8192", 64, 8192),
)


def step_batch(groups: int, group_size: int, vocab: int, seed: int) -> list[Trajectory]:
    """One step's trajectories in landing order: a shared 16-token prompt per group, then one
    scored segment; lengths log-uniform over [SHORTEST, LONGEST]."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = tuple(rng.randrange(vocab) for _ in range(PROMPT))
        for k in range(group_size):
            n = int(math.exp(rng.uniform(math.log(SHORTEST), math.log(LONGEST))))
            action = tuple(rng.randrange(vocab) for _ in range(n - PROMPT))
            out.append(
                Trajectory(f"g{g}-t{k}", f"g{g}", k, prompt, (Segment(action, True),), 0, 1, "stop", 0.0, 0.0)
            )
    rng.shuffle(out)  # landing order mixes groups and lengths
    return out


def calls_of(batch: list[Trajectory], rows: int, tokens: int | None) -> list[list[Trajectory]]:
    out, k = [], 0
    while k < len(batch):
        n = call_size([len(t.tokens) for t in batch[k:]], rows, tokens)
        out.append(batch[k : k + n])
        k += n
    return out


class SavedBytes:
    """Bytes of the distinct storages autograd saves for backward (parameters excluded)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.skip = {p.untyped_storage().data_ptr() for p in params}
        self.seen: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.skip:
            self.seen[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.seen.values())


def run_call(policy: GRPOPolicy, call: list[Trajectory], count: bool = False) -> int:
    """One direct call (every reward known) of score_tokens + add_tokens; the saved bytes if ``count``."""
    acc = direct_accumulator(policy, call)
    saved = SavedBytes(list(policy.parameters()))
    with (
        torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t)
        if count
        else contextlib.nullcontext()
    ):
        scores = policy.score_tokens(call)
    acc.add_scored(call, scores)
    return saved.total


def padded_tokens(policy: GRPOPolicy, call: list[Trajectory]) -> int:
    from thundersync_lightning.modules.micro_batches import micro_batches

    lengths = [len(t.tokens) for t in call]
    h = policy.hparams
    chunks = micro_batches(lengths, h.score_batch_tokens, h.score_max_padding, h.score_forward_tokens)
    return sum(len(c) * max(lengths[i] for i in c) for c in chunks)


def planned_bytes(policy: GRPOPolicy, rows: int, tokens: int | None, trajectories: int) -> int:
    params = sum(p.numel() for p in policy.parameters())
    shape = ModelShape(params, params, 4, Architecture.of(policy.model.config))
    inputs = PlanInputs(
        model=shape, accelerator="cpu", groups_per_step=trajectories // 8, group_size=8,
        max_tokens_per_trajectory=LONGEST, max_batch_trajectories=rows, max_batch_tokens=tokens,
        score_max_padding=policy.hparams.score_max_padding,
        score_forward_tokens=policy.hparams.score_forward_tokens,
    )  # fmt: skip
    return plan_memory(inputs).row("activations").device


def padding_mask_cost(policy: GRPOPolicy, call: list[Trajectory], repeats: int) -> dict:
    """One right-padded forward and backward of ``call`` with the padding mask the policy no
    longer passes, against without it (what ``score_tokens`` runs): saved bytes and seconds."""
    n, width = len(call), max(len(t.tokens) for t in call)
    ids = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for row, t in enumerate(call):
        ids[row, : len(t.tokens)] = torch.tensor(t.tokens)
        mask[row, : len(t.tokens)] = 1

    def once(with_mask: bool, count: bool = False) -> int:
        saved = SavedBytes(list(policy.parameters()))
        hooks = (
            torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t)
            if count
            else contextlib.nullcontext()
        )
        with hooks:
            logits = policy.model(input_ids=ids, attention_mask=mask if with_mask else None).logits
        (logits.float().logsumexp(-1) * mask).sum().backward()
        policy.zero_grad(set_to_none=True)
        return saved.total

    out = {"rows": n, "width": width, "bytes_with_mask": once(True, True), "bytes_without": once(False, True)}
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for rep in range(repeats + 1):
        for with_mask in (True, False):
            wall, _, _ = timed_cpu(lambda m=with_mask: once(m))
            if rep:
                seconds[with_mask].append(wall)
    out["seconds_with_mask"], out["seconds_without"] = median(seconds[True]), median(seconds[False])
    out["bytes_with_over_without"] = out["bytes_with_mask"] / out["bytes_without"]
    out["speed_without_over_with"] = out["seconds_with_mask"] / out["seconds_without"]
    return out


def measure(groups: int, repeats: int, hidden: int) -> dict:
    torch.manual_seed(0)
    vocab = 512
    policy = GRPOPolicy(config=qwen3_config(hidden, 2 * hidden, 2, vocab, max_positions=2 * LONGEST))
    out: dict[str, dict] = {}
    batch = step_batch(groups, 8, vocab, seed=0)
    for label, rows, tokens in SETTINGS:
        calls = calls_of(batch, rows, tokens)
        held = [run_call(policy, c, count=True) for c in calls]
        padded = [padded_tokens(policy, c) for c in calls]
        planned = planned_bytes(policy, rows, tokens, len(batch))
        out[label] = {
            "max_batch_trajectories": rows,
            "max_batch_tokens": tokens,
            "calls": len(calls),
            "largest_call_tokens": max(sum(len(t.tokens) for t in c) for c in calls),
            "largest_call_padded_tokens": max(padded),
            "measured_bytes_per_padded_token": max(h / p for h, p in zip(held, padded)),
            "largest_call_activation_bytes": max(held),
            "planned_activation_bytes": planned,
            "measured_over_planned": max(held) / planned,
            "wall_s": [],
            "cpu_s": [],
        }
    for rep in range(repeats + 1):  # the first round warms up
        for label, rows, tokens in SETTINGS:  # interleaved: the same machine conditions for each
            calls = calls_of(batch, rows, tokens)
            wall, cpu, _ = timed_cpu(lambda calls=calls: [run_call(policy, c) for c in calls])
            if rep:
                out[label]["wall_s"].append(wall)
                out[label]["cpu_s"].append(cpu)
    total = sum(len(t.tokens) for t in batch)
    default = SETTINGS[0][0]
    for row in out.values():
        row["wall_s_median"], row["cpu_s_median"] = median(row["wall_s"]), median(row["cpu_s"])
        row["tokens_per_s"] = total / row["wall_s_median"]
    for row in out.values():
        row["speed_over_default"] = out[default]["wall_s_median"] / row["wall_s_median"]
        row["cpu_speed_over_default"] = out[default]["cpu_s_median"] / row["cpu_s_median"]
    arch = Architecture.of(policy.model.config)
    assert arch is not None
    largest = max(calls_of(batch, 8, None), key=lambda c: sum(len(t.tokens) for t in c))
    return {"settings": out, "trajectories": len(batch), "tokens": total,
            "planned_bytes_per_token": arch.token_activation_bytes(4, False),
            "padding_mask": padding_mask_cost(policy, largest, repeats)}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, default_threads=1)
    parser.add_argument("--groups", type=int, default=None, help="groups of 8 (default 8; quick 2)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 3; quick 1)")
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    groups = args.groups or (2 if args.quick else 8)
    repeats = args.repeats or (1 if args.quick else 3)
    load_start = load_average()
    result = measure(groups, repeats, args.hidden)
    payload = {
        "description": "a learner call's activations and the step's speed, cut by rows or by tokens",
        **result,
        "hidden": args.hidden,
        "longest_tokens": LONGEST,
        "threads": args.threads,
        "quick": args.quick,
        "load_average_start": load_start,
        "load_average_end": load_average(),
    }
    path = write_result(args.out, NAME, payload)
    s = result["settings"]
    write_bar_chart(
        path.with_suffix(".png"),
        {k: {"measured": v["largest_call_activation_bytes"] / 2**20,
             "planned": v["planned_activation_bytes"] / 2**20} for k, v in s.items()},
        ylabel="largest call's activations (MiB)",
        title=f"{result['trajectories']} trajectories of {SHORTEST}-{LONGEST} tokens: row cap vs token cap",
    )  # fmt: skip
    for label, v in s.items():
        print(
            f"{label:>18}: {v['calls']:>2} calls, largest {v['largest_call_tokens']} tokens "
            f"({v['largest_call_padded_tokens']} padded), activations "
            f"{v['largest_call_activation_bytes'] / 2**20:.1f} MiB of "
            f"{v['planned_activation_bytes'] / 2**20:.1f} planned ({v['measured_over_planned']:.2f}), speed "
            f"{v['speed_over_default']:.2f}x the default (CPU {v['cpu_speed_over_default']:.2f}x)"
        )
    m = result["padding_mask"]
    print(
        f"padding mask on a {m['rows']} x {m['width']} call: {m['bytes_with_over_without']:.2f}x the saved "
        f"bytes, {m['speed_without_over_with']:.2f}x slower than without"
    )
    per_token = max(v["measured_bytes_per_padded_token"] for v in s.values())
    print(
        f"bytes saved per padded token: {per_token:.0f} measured, {result['planned_bytes_per_token']} planned"
    )
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
