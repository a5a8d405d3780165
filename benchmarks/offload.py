"""Backward time with offload on vs off: does the overlapped pinned copy slow a backward down?

One StreamingGRPO step per offload mode on the same policy (a randomly initialised Qwen3 of the
given size) and the same trajectories: every trajectory is backpropagated before its reward (its
gradient is held, i.e. copied to the host when offloaded), then the rewards land. Reported: median
seconds per held backward per mode and the ratio to ``offload="none"`` (measured in one run), two
ways:

- ``reserved`` (``ratio_to_none``): the accumulator with both bounds set
  (``max_open_groups=1``, ``max_held_trajectories`` = the trajectories), which allocates (and
  pins) the host buffers the bounds allow when it is built (``reserve_s``: how long that took);
- ``unreserved`` (``ratio_to_none_unreserved``): no bounds, so every held backward allocates a
  fresh host buffer: ``cudaHostAlloc`` for pinned memory, first-touch page faults for pageable
  memory (the cost the one H200 run measured: 12x with pinned, 14.6x with pageable).

On CUDA the modes are none / cpu / pinned; on CPU none / cpu (pinned needs a CUDA build).

    python benchmarks/offload.py --device cuda --hidden 1024 --layers 8 --vocab 32000 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from thundersync_lightning.core import StreamingGRPO


def policy(device: str, hidden: int, layers: int, vocab: int) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        head_dim=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).to(device).train()


def held_backward_seconds(model, offload: str, n: int, tokens: int, device: str, reserve: bool) -> dict:
    """Seconds per held backward (the first one left out) and the accumulator's construction."""
    params = [p for p in model.parameters() if p.requires_grad]
    start = time.perf_counter()
    bounds = {"max_open_groups": 1, "max_held_trajectories": n} if reserve else {}
    acc = StreamingGRPO(params, offload=offload, **bounds)
    built = time.perf_counter() - start
    ids = [f"t{i}" for i in range(n)]
    acc.open_group("g", ids)
    g = torch.Generator().manual_seed(1)
    times = []
    for tid in ids:
        x = torch.randint(0, model.config.vocab_size, (1, tokens), generator=g).to(device)
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        logp = (
            torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1).gather(1, x[0, 1:, None]).sum()
        )
        acc.add_logprob(tid, logp)
        if device == "cuda":  # the compute stream only: a copy in flight on the side stream is not waited
            torch.cuda.current_stream().synchronize()  # for unless the next backward needs its staging buffer
        times.append(time.perf_counter() - start)
    for k, tid in enumerate(ids):
        acc.add_reward(tid, float(k % 2))
    acc.finish()
    return {"seconds": times[1:], "built_s": built}  # the first backward also warms up autograd


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--trajectories", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument(
        "--repeats", type=int, default=1, help="steps per (mode, way), interleaved; medians over all"
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default="runs/bench-offload")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = policy(args.device, args.hidden, args.layers, args.vocab)
    modes = ["none", "cpu", "pinned"] if args.device == "cuda" else ["none", "cpu"]
    seconds: dict[str, dict[str, list[float]]] = {
        w: {m: [] for m in modes} for w in ("reserved", "unreserved")
    }
    built: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.repeats):  # interleaved, so a slow phase of a shared machine hits every mode
        for way in ("reserved", "unreserved"):
            for mode in modes:
                r = held_backward_seconds(
                    model, mode, args.trajectories, args.tokens, args.device, way == "reserved"
                )
                seconds[way][mode] += r["seconds"]
                if way == "reserved":
                    built[mode].append(r["built_s"])
    medians = {w: {m: statistics.median(v) for m, v in by.items()} for w, by in seconds.items()}
    result = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "trajectories": args.trajectories,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "median_held_backward_s": medians["reserved"],
        "ratio_to_none": {m: medians["reserved"][m] / medians["reserved"]["none"] for m in modes},
        "median_held_backward_s_unreserved": medians["unreserved"],
        "ratio_to_none_unreserved": {
            m: medians["unreserved"][m] / medians["unreserved"]["none"] for m in modes
        },
        "reserve_s": {m: statistics.median(v) for m, v in built.items()},
        "reserved_host_buffers": args.trajectories + 2,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "offload.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("ratio_to_none", "ratio_to_none_unreserved", "reserve_s")}))
    return result


if __name__ == "__main__":
    main()
