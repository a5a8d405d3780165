"""``export``: a trained checkpoint as a Hugging Face model directory that others can load and serve.

    thundersync-lightning export --ckpt_path runs/x/checkpoints/last.ckpt --out models/x [--adapter-only]

The directory holds what ``AutoModelForCausalLM.from_pretrained(DIR)`` and vLLM's ``LLM(model=DIR)``
read: ``config.json``, ``model.safetensors``, ``generation_config.json`` (its ``eos_token_id``
includes the tokenizer's end of turn, so generation stops where a training turn ended) and the
tokenizer with its chat template. With LoRA the adapters are merged by default:

    W = W_base + (alpha / r) B A      for every adapted linear layer

so the directory is a plain model of the base architecture. ``--adapter-only`` writes the peft
adapter instead (``adapter_config.json`` and ``adapter_model.safetensors``, loaded by
``PeftModel.from_pretrained(base, DIR)``), its ``base_model_name_or_path`` the absolute path of the
policy's ``pretrained_path``; a base built from a config with random weights has no directory to
point at, so adapter-only export refuses it.

The tokenizer comes from, first to last: ``--tokenizer``, the policy's ``pretrained_path`` when it
holds one, the task source's ``tokenizer_path`` (and ``chat_template``) in the run's ``config.yaml``
beside the checkpoint (``DIR/config.yaml`` for ``DIR/checkpoints/x.ckpt``). A policy that never had
a tokenizer (the toy's vocabulary of ids) is exported without one, and the command says so.

Nothing is half-written: the directory is assembled next to ``--out`` and moved into place at the end;
an ``--out`` that exists and is not empty is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from .core.errors import ConfigError, ThunderSyncError
from .envs.tokens import has_tokenizer, load_tokenizer
from .modules.lora import merged_state_dict
from .modules.policy import GRPOPolicy

__all__ = ["ExportError", "ExportResult", "export_checkpoint", "export_main", "export_policy"]


class ExportError(ThunderSyncError):
    """The checkpoint cannot be exported as asked (the message says why and what to change)."""


@dataclass(frozen=True)
class ExportResult:
    """What was written: the directory, ``merged`` (a full model) or ``adapter`` (peft), and the
    directory the tokenizer came from (``None``: none was written)."""

    out: Path
    kind: Literal["merged", "adapter"]
    tokenizer_from: str | None

    def lines(self) -> list[str]:
        what = (
            "a peft adapter"
            if self.kind == "adapter"
            else "a Hugging Face model (LoRA merged where there was one)"
        )
        lines = [f"export: wrote {what} to {self.out}"]
        if self.tokenizer_from is None:
            lines.append(
                "  no tokenizer: this policy was trained without one (pass --tokenizer DIR to add one)"
            )
        else:
            lines.append(f"  tokenizer and chat template from {self.tokenizer_from}")
        return lines


def _run_config(ckpt_path: Path) -> Mapping[str, Any]:
    """The task source's init_args in the run's ``config.yaml`` (DIR/checkpoints/x.ckpt -> DIR)."""
    for candidate in (ckpt_path.parent.parent / "config.yaml", ckpt_path.parent / "config.yaml"):
        if candidate.is_file():
            try:
                config = yaml.safe_load(candidate.read_text()) or {}
                tasks = (config.get("data") or {}).get("tasks") or {}
                return dict(tasks.get("init_args") or {}) if isinstance(tasks, dict) else {}
            except (yaml.YAMLError, AttributeError):
                return {}
    return {}


def _tokenizer_source(
    module: GRPOPolicy, tokenizer_path: str | None, task_args: Mapping[str, Any]
) -> tuple[str | None, str, str | None]:
    """(directory, where it was named, chat template override) of the tokenizer to save; no directory:
    none."""
    template = task_args.get("chat_template")
    if tokenizer_path is not None:
        return tokenizer_path, "--tokenizer", template
    pretrained = module.model_spec.pretrained_path
    if pretrained is not None and has_tokenizer(pretrained):
        return pretrained, "model.pretrained_path", template
    task_tokenizer = task_args.get("tokenizer_path")
    if isinstance(task_tokenizer, str):  # checked by load_tokenizer: the run's tokenizer must be here
        return (
            task_tokenizer,
            "the run's data.tasks.init_args.tokenizer_path (pass --tokenizer DIR)",
            template,
        )
    return None, "", None


def _load_tokenizer(path: str, option: str, chat_template: str | None) -> Any:
    tok = load_tokenizer(path, option)
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def _stop_at_end_of_turn(model: Any, tokenizer: Any) -> None:
    """``generation_config.eos_token_id`` includes the tokenizer's end-of-turn token
    (kept: the model's own)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    config = getattr(model, "generation_config", None)
    if eos is None or config is None:
        return
    current = config.eos_token_id
    ids = [] if current is None else list(current) if isinstance(current, (list, tuple)) else [current]
    if eos not in ids:
        ids.append(int(eos))
    config.eos_token_id = ids[0] if len(ids) == 1 else ids
    if config.pad_token_id is None and tokenizer.pad_token_id is not None:
        config.pad_token_id = int(tokenizer.pad_token_id)


def _write(module: GRPOPolicy, where: Path, adapter_only: bool, tokenizer: Any) -> None:
    model = module.model
    if adapter_only:
        model.save_pretrained(where)
        adapter_config = where / "adapter_config.json"
        data = json.loads(adapter_config.read_text())
        data["base_model_name_or_path"] = os.path.abspath(str(module.model_spec.pretrained_path))
        adapter_config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    elif module.hparams.get("lora") is not None:
        base = model.get_base_model()  # the architecture and config; its LoRA layers are not saved
        if tokenizer is not None:
            _stop_at_end_of_turn(base, tokenizer)
        base.save_pretrained(where, state_dict=merged_state_dict(model), safe_serialization=True)
    else:
        if tokenizer is not None:
            _stop_at_end_of_turn(model, tokenizer)
        model.save_pretrained(where, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(where)


def export_policy(
    module: GRPOPolicy,
    out: str | os.PathLike[str],
    *,
    adapter_only: bool = False,
    tokenizer_path: str | None = None,
    chat_template: str | None = None,
    task_args: Mapping[str, Any] | None = None,
) -> ExportResult:
    """Write ``module``'s model (LoRA merged, or the adapter alone) and tokenizer to ``out``.

    ``task_args``: the task source's options (``tokenizer_path``, ``chat_template``) used when
    neither ``tokenizer_path`` nor the policy's ``pretrained_path`` holds a tokenizer.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"--out {str(out)!r} exists and is not an empty directory: give a new directory")
    lora = module.hparams.get("lora") is not None
    if adapter_only and not lora:
        raise ExportError(
            "--adapter-only: this policy has no LoRA adapters (it is a full fine-tune); drop the flag"
        )
    if adapter_only and module.model_spec.pretrained_path is None:
        raise ExportError(
            "--adapter-only: the base model was built from a config with random weights, so there is no base "
            "directory for the adapter to name; export the merged model (drop the flag)"
        )
    args = dict(task_args or {})
    if chat_template is not None:
        args["chat_template"] = chat_template
    source, option, template = _tokenizer_source(module, tokenizer_path, args)
    tokenizer = _load_tokenizer(source, option, template) if source is not None else None
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        _write(module, staging, adapter_only, tokenizer)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(out, "adapter" if adapter_only else "merged", source)


def export_checkpoint(
    ckpt_path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    adapter_only: bool = False,
    tokenizer_path: str | None = None,
) -> ExportResult:
    """Load a ``GRPOPolicy`` checkpoint (on CPU) and :func:`export_policy` it; the tokenizer may come
    from the run's ``config.yaml`` beside the checkpoint."""
    ckpt = Path(ckpt_path)
    if not ckpt.is_file():
        raise ExportError(f"--ckpt_path {str(ckpt)!r} is not a file (e.g. runs/x/checkpoints/last.ckpt)")
    # the user's own checkpoint: its hyperparameters hold config dataclasses (LoraSettings), not only tensors
    module = GRPOPolicy.load_from_checkpoint(ckpt, map_location="cpu", weights_only=False)
    return export_policy(
        module.eval(),
        out,
        adapter_only=adapter_only,
        tokenizer_path=tokenizer_path,
        task_args=_run_config(ckpt),
    )


def export_main(args: list[str]) -> int:
    """``thundersync-lightning export``: 0 when written, 2 when the checkpoint cannot be exported as asked."""
    from .cli_errors import ShortArgumentParser

    parser = ShortArgumentParser(
        prog="thundersync-lightning export",
        description="A checkpoint as a Hugging Face model directory (transformers, vLLM): LoRA merged, "
        "or the adapter alone; the tokenizer and chat template beside it.",
    )
    parser.add_argument(
        "--ckpt_path", required=True, help="a checkpoint of fit (e.g. runs/x/checkpoints/last.ckpt)"
    )
    parser.add_argument("--out", required=True, help="the directory to write (new or empty)")
    parser.add_argument(
        "--adapter-only",
        "--adapter_only",
        dest="adapter_only",
        action="store_true",
        help="LoRA: write the peft adapter alone (default: the merged model)",
    )
    parser.add_argument(
        "--tokenizer",
        help="the tokenizer directory to save beside the model (default: the policy's or the run's)",
    )
    own = parser.parse_args(args)
    try:
        result = export_checkpoint(
            own.ckpt_path, own.out, adapter_only=own.adapter_only, tokenizer_path=own.tokenizer
        )
    except (ExportError, ConfigError) as exc:
        print(f"thundersync-lightning export: {exc}", file=sys.stderr)
        return 2
    print("\n".join(result.lines()))
    return 0
