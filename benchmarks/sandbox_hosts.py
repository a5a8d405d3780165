"""What a sandbox host costs a SWE-bench episode: this host's engine against a podman service reached
by URL, on one machine (the service's socket is local, so the ratio is the path's own cost, not a
network's).

One instance (a shipped local task's repository in an image built from the local test image, as
``make test-containers`` builds it), interleaved rounds of each side:

- ``open``: the workspace's set-up (``env.reset()``): the image's /testbed copied out and chowned,
  the base commit's bare copy (host: ``podman cp`` and host git; sandbox host: volumes with their
  holders, set-up containers);
- ``command``: one agent command (``true``), median of ``--commands`` runs;
- ``verdict``: the gold patch's verdict (a fresh tree, the config manifest, ``git apply``, the eval
  run, grading);
- ``close``: freeing the workspace.

Median seconds per side and the ratios sandbox host / this host, as JSON and a bar chart. Needs
podman, runc and the local image (``make test-containers`` sets them up).

    python benchmarks/sandbox_hosts.py [--quick] [--out DIR] [--rounds N] [--commands N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(
    0, str(ROOT)
)  # the tests' task-image helpers (tests/envs): the same instance as make test-containers
from _common import add_common_args, median, write_bar_chart, write_result  # noqa: E402

NAME = "sandbox_hosts"
BASE_IMAGE = os.environ.get("THUNDERSYNC_TEST_IMAGE", "localhost/thundersync-pytest:latest")
PHASES = ("open", "command", "verdict", "close")


def build_instance(engine: str, ctx: str) -> tuple[Any, dict[str, Any]]:
    """The merge_intervals task as a SWE-bench row and its image (built without pulling)."""
    from tests.envs._support import git_repo, swebench_row

    from thundersync_lightning.envs.code import load_tasks

    task = load_tasks(names=["merge_intervals"])[0]
    base = git_repo(task, os.path.join(ctx, "testbed"))
    with open(os.path.join(ctx, "Containerfile"), "w") as f:
        f.write(f"FROM {BASE_IMAGE}\nCOPY testbed /testbed\nWORKDIR /testbed\n")
    tag = "localhost/thundersync-swe-merge_intervals:bench"
    subprocess.run([engine, "build", "--pull=never", "-t", tag, ctx], check=True, capture_output=True)
    return task, swebench_row(task, image=tag, base_commit=base)


def one_round(source: Any, task: Any, commands: int) -> dict[str, float]:
    from thundersync_lightning.envs.codec import ByteCodec

    codec = ByteCodec()
    env = source.make_env(source.tasks(0, 1, 0)[0], 0)
    out: dict[str, float] = {}
    try:
        start = time.perf_counter()
        env.reset()
        out["open"] = time.perf_counter() - start
        times = []
        for _ in range(commands):
            start = time.perf_counter()
            if not env.workspace.run("true").ok:
                raise RuntimeError("a command failed")
            times.append(time.perf_counter() - start)
        out["command"] = median(times)
        env.step(
            codec.encode(f"bash\ncat > /tmp/p <<'EOF_P'\n{task.gold_patch}EOF_P\ngit apply /tmp/p")
            + (ByteCodec.END_OF_ACTION,)
        )
        env.step(codec.encode("submit"))
        start = time.perf_counter()
        if env.verdict() != 1.0:
            raise RuntimeError(f"the gold patch did not resolve: {env.outcome()}")
        out["verdict"] = time.perf_counter() - start
    finally:
        start = time.perf_counter()
        env.close()
        out["close"] = time.perf_counter() - start
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(parser, default_threads=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--commands", type=int, default=10)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.commands = 2, 5
    from tests.envs.podman_service import PodmanService

    from thundersync_lightning.envs.sandbox import find_engine, image_exists
    from thundersync_lightning.envs.swebench import SWEbenchTasks

    engine = find_engine("podman")
    if engine is None or not image_exists(BASE_IMAGE, engine):
        raise SystemExit(f"needs podman and the local image {BASE_IMAGE} (make test-containers builds it)")
    load_start = [round(x, 2) for x in os.getloadavg()]
    ctx = tempfile.mkdtemp(prefix="tsl-bench-image-")
    service = PodmanService(engine)
    try:
        task, row = build_instance(engine, ctx)
        path = os.path.join(ctx, "instances.jsonl")
        with open(path, "w") as f:
            f.write(json.dumps(row) + "\n")
        common = dict(
            instances=path,
            engine="podman",
            memory="1g",
            nproc=256,
            eval_timeout_s=300,
            uid_base=3_980_000,
            uid_count=16,
        )
        sides = {
            "this host": SWEbenchTasks(**common),
            "sandbox host": SWEbenchTasks(**common, sandbox_hosts=[{"url": service.url, "capacity": 4}]),
        }
        samples: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for r in range(args.rounds):
            for side, source in sides.items():  # interleaved: load drift hits both sides alike
                samples[side].append(one_round(source, task, args.commands))
                print(
                    f"round {r + 1}/{args.rounds} {side}: "
                    + ", ".join(f"{k} {v:.3f} s" for k, v in samples[side][-1].items()),
                    flush=True,
                )
    finally:
        service.close()
        shutil.rmtree(ctx, ignore_errors=True)
    medians = {side: {p: median(s[p] for s in rows) for p in PHASES} for side, rows in samples.items()}
    ratios = {p: medians["sandbox host"][p] / medians["this host"][p] for p in PHASES}
    for p in PHASES:
        print(
            f"{p}: this host {medians['this host'][p]:.3f} s, sandbox host {medians['sandbox host'][p]:.3f} "
            f"s ({ratios[p]:.2f}x)"
        )
    payload = {
        "settings": {
            "rounds": args.rounds,
            "commands": args.commands,
            "image": row["image"],
            "service": "podman system service on a unix socket of this machine",
        },
        "load_average_start": load_start,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "median_seconds": medians,
        "sandbox_host_over_this_host": ratios,
        "samples": samples,
    }
    path = write_result(args.out, NAME, payload)
    write_bar_chart(
        Path(args.out) / f"{NAME}.png",
        {p: {s: medians[s][p] for s in medians} for p in PHASES},
        ylabel="seconds (median)",
        title="SWE-bench episode phases: this host's engine vs a sandbox host",
    )
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
