"""Backward time with offload on vs off: does the overlapped pinned copy slow a backward down?

One StreamingGRPO step per offload mode on the same policy (a randomly initialised Qwen3 of the
given size) and the same trajectories: every trajectory is backpropagated before its reward (its
gradient is held, i.e. copied to the host when offloaded), then the rewards land. Reported: median
seconds per held backward per mode and the ratio to ``offload="none"`` (measured in one run).
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


def held_backward_seconds(model, offload: str, n: int, tokens: int, device: str) -> list[float]:
    acc = StreamingGRPO([p for p in model.parameters() if p.requires_grad], offload=offload)
    ids = [f"t{i}" for i in range(n)]
    acc.open_group("g", ids)
    g = torch.Generator().manual_seed(1)
    times = []
    for tid in ids:
        x = torch.randint(0, model.config.vocab_size, (1, tokens), generator=g).to(device)
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        logp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1).gather(1, x[0, 1:, None]).sum()
        acc.add_logprob(tid, logp)
        if device == "cuda":  # the compute stream only: a copy in flight on the side stream is not waited
            torch.cuda.current_stream().synchronize()  # for unless the next backward needs its staging buffer
        times.append(time.perf_counter() - start)
    for k, tid in enumerate(ids):
        acc.add_reward(tid, float(k % 2))
    acc.finish()
    return times[1:]  # the first one allocates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--trajectories", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--out", default="runs/bench-offload")
    args = ap.parse_args()
    model = policy(args.device, args.hidden, args.layers, args.vocab)
    modes = ["none", "cpu", "pinned"] if args.device == "cuda" else ["none", "cpu"]
    medians = {}
    for mode in modes:
        seconds = held_backward_seconds(model, mode, args.trajectories, args.tokens, args.device)
        medians[mode] = statistics.median(seconds)
    result = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "parameters": sum(p.numel() for p in model.parameters()),
        "trajectories": args.trajectories,
        "tokens": args.tokens,
        "median_held_backward_s": medians,
        "ratio_to_none": {m: medians[m] / medians["none"] for m in modes},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "offload.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result["ratio_to_none"]))


if __name__ == "__main__":
    main()
