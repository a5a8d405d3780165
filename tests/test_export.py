"""``thundersync-lightning export``: the written directory loads in transformers (and peft) and gives
the trained module's logits; the tokenizer and chat template travel with it; bad requests write nothing."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.envs.qwen_style import HERMES_TEMPLATE, QWEN3_TEMPLATE, save_model
from thundersync_lightning.cli import main
from thundersync_lightning.export import ExportError, export_checkpoint
from thundersync_lightning.modules import GRPOPolicy
from thundersync_lightning.modules.lora import LoraSettings


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    """A Qwen-style tokenizer (think and tool-call tokens, chat template) and a tiny random Qwen3."""
    path = tmp_path_factory.mktemp("base")
    save_model(str(path))
    return path


def trained_checkpoint(path: Path, **policy: object) -> tuple[GRPOPolicy, Path]:
    """A policy whose trainable weights moved away from their start, saved as Lightning saves a fit's."""
    torch.manual_seed(1)
    module = GRPOPolicy(**policy)
    with torch.no_grad():
        for p in module.model.parameters():
            if p.requires_grad:  # LoRA's B starts at zero: the merge must carry this change
                p.add_(0.05 * torch.randn_like(p))
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.strategy.connect(module)
    ckpt = path / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    trainer.save_checkpoint(ckpt)
    return module.eval(), ckpt


def logits(model: torch.nn.Module, vocab: int) -> torch.Tensor:
    ids = torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_full_fine_tune_exports_a_directory_transformers_loads_with_the_trained_logits(tmp_path, base_dir):
    module, ckpt = trained_checkpoint(tmp_path, pretrained_path=str(base_dir))
    main_out = tmp_path / "model"
    with pytest.raises(SystemExit) as done:
        main(["export", "--ckpt_path", str(ckpt), "--out", str(main_out)])
    assert done.value.code == 0
    exported = AutoModelForCausalLM.from_pretrained(main_out, local_files_only=True)
    assert torch.equal(logits(exported, module.vocab_size), logits(module.model, module.vocab_size))
    assert (main_out / "model.safetensors").is_file() and json.loads((main_out / "config.json").read_text())[
        "architectures"
    ] == ["Qwen3ForCausalLM"]
    tok = AutoTokenizer.from_pretrained(main_out, local_files_only=True)
    assert tok.chat_template == QWEN3_TEMPLATE
    assert tok.convert_tokens_to_ids("<think>") == AutoTokenizer.from_pretrained(
        base_dir
    ).convert_tokens_to_ids("<think>")
    # generation stops where a training turn ended: at the tokenizer's end of turn
    assert json.loads((main_out / "generation_config.json").read_text())["eos_token_id"] == tok.eos_token_id


def test_a_lora_policy_exports_merged_weights_a_plain_model_loads_with_the_trained_logits(tmp_path, base_dir):
    module, ckpt = trained_checkpoint(tmp_path, pretrained_path=str(base_dir), lora=LoraSettings(r=4))
    result = export_checkpoint(ckpt, tmp_path / "merged")
    assert result.kind == "merged"
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", local_files_only=True)
    assert not any("lora" in name for name in exported.state_dict())
    trained, merged = logits(module.model, module.vocab_size), logits(exported, module.vocab_size)
    base = logits(AutoModelForCausalLM.from_pretrained(base_dir), module.vocab_size)
    assert (trained - base).abs().max() > 1e-2  # the adapters changed the model ...
    torch.testing.assert_close(merged, trained, rtol=1e-5, atol=1e-5)  # ... and the merge kept the change


def test_adapter_only_export_is_a_peft_adapter_on_the_base_directory_with_the_trained_logits(
    tmp_path, base_dir
):
    from peft import AutoPeftModelForCausalLM

    module, ckpt = trained_checkpoint(tmp_path, pretrained_path=str(base_dir), lora=LoraSettings(r=4))
    with pytest.raises(SystemExit) as done:
        main(["export", "--ckpt_path", str(ckpt), "--out", str(tmp_path / "adapter"), "--adapter-only"])
    assert done.value.code == 0
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base_dir.resolve())
    assert not (tmp_path / "adapter" / "model.safetensors").exists()
    exported = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "adapter", local_files_only=True)
    assert torch.equal(logits(exported, module.vocab_size), logits(module.model, module.vocab_size))


def test_a_policy_built_from_a_config_exports_without_a_tokenizer_and_says_so(tmp_path, capsys):
    module, ckpt = trained_checkpoint(tmp_path)  # the tiny random Qwen3 (tied embeddings), no tokenizer
    with pytest.raises(SystemExit) as done:
        main(["export", "--ckpt_path", str(ckpt), "--out", str(tmp_path / "model")])
    assert done.value.code == 0
    assert "no tokenizer: this policy was trained without one" in capsys.readouterr().out
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "model", local_files_only=True)
    assert torch.equal(logits(exported, module.vocab_size), logits(module.model, module.vocab_size))
    assert not (tmp_path / "model" / "tokenizer_config.json").exists()


def test_the_tokenizer_and_template_come_from_the_runs_config_when_the_model_has_none(tmp_path, base_dir):
    _, ckpt = trained_checkpoint(tmp_path)
    config = {"data": {"tasks": {"class_path": "x.Tasks",
                                 "init_args": {"tokenizer_path": str(base_dir),
                                               "chat_template": HERMES_TEMPLATE}}}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))  # beside checkpoints/, as fit writes it
    result = export_checkpoint(ckpt, tmp_path / "model")
    assert result.tokenizer_from == str(base_dir)
    assert AutoTokenizer.from_pretrained(tmp_path / "model").chat_template == HERMES_TEMPLATE


@pytest.mark.parametrize(
    "setup, args, message",
    [
        ("full", ["--adapter-only"], "this policy has no LoRA adapters"),
        ("lora-random", ["--adapter-only"], "built from a config with random weights"),
        ("full", ["--tokenizer", "models/none"], "--tokenizer 'models/none (from "),
        ("full-nonempty", [], "exists and is not an empty directory"),
    ],
)
def test_an_export_that_cannot_be_done_as_asked_says_why_exits_2_and_writes_nothing(
    tmp_path, base_dir, capsys, setup, args, message
):
    policy = {"lora": LoraSettings(r=4)} if setup == "lora-random" else {"pretrained_path": str(base_dir)}
    _, ckpt = trained_checkpoint(tmp_path, **policy)
    out = tmp_path / "out"
    if setup == "full-nonempty":
        out.mkdir()
        (out / "mine.txt").write_text("keep me")
    with pytest.raises(SystemExit) as done:
        main(["export", "--ckpt_path", str(ckpt), "--out", str(out), *args])
    assert done.value.code == 2
    assert message in capsys.readouterr().err
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == (["checkpoints", "out"] if setup == "full-nonempty" else ["checkpoints"])
    if setup == "full-nonempty":
        assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_a_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(ExportError, match="is not a file"):
        export_checkpoint(tmp_path / "none.ckpt", tmp_path / "out")
