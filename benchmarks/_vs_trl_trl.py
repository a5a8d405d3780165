"""One TRL 1.16 ``GRPOTrainer`` run of :mod:`vs_trl`'s task, in TRL's own virtual environment.

    .venv-trl/bin/python benchmarks/_vs_trl_trl.py SPEC.json

``SPEC.json`` (written by ``vs_trl.py``): model directory, data file, task, seed, steps, batch
settings and the JSONL path the per-step probe appends to (the lines :mod:`_vs_trl_probe` writes
for the project's runs: wall clock and CPU of the process tree at every step's end, generated
tokens, mean reward). Everything not set here is TRL's default, as a new user would run it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _vs_trl_task as task  # noqa: E402


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    import torch

    torch.set_num_threads(spec["threads"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in Path(spec["data"]).read_text().splitlines()]
    dataset = Dataset.from_list([{"prompt": r["prompt"]} for r in rows])
    out = open(spec["steps_path"], "a")  # noqa: SIM115

    class Probe(TrainerCallback):
        logs: dict = {}

        def on_train_begin(self, args, state, control, **kw):
            out.write(
                json.dumps({"step": 0, "wall": time.monotonic(), "cpu": task.tree_cpu_seconds()}) + "\n"
            )
            out.flush()

        def on_step_end(self, args, state, control, **kw):
            self._pending = {
                "step": state.global_step,
                "wall": time.monotonic(),
                "cpu": task.tree_cpu_seconds(),
            }

        def on_log(self, args, state, control, logs=None, **kw):
            # the step's metrics are logged right after its on_step_end (logging_steps=1)
            pending = getattr(self, "_pending", None)
            if pending is None or logs is None or "reward" not in logs:
                return
            n = spec["groups"] * spec["group_size"]
            pending.update(
                {
                    "tokens": round(logs["completions/mean_length"] * n),
                    "completions": n,
                    "reward": logs["reward"],
                    "failures": 0,
                    "tool_calls": round(logs.get("tools/call_frequency", 0.0) * n),
                }
            )
            out.write(json.dumps(pending) + "\n")
            out.flush()
            self._pending = None

    n = spec["groups"] * spec["group_size"]
    config = GRPOConfig(
        output_dir=spec["run_dir"],
        seed=spec["seed"],
        data_seed=spec["seed"],
        max_steps=spec["steps"],
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        per_device_train_batch_size=n,
        num_generations=spec["group_size"],
        gradient_accumulation_steps=1,
        max_completion_length=spec["max_completion_tokens"],
        temperature=1.0,
        use_cpu=True,
        bf16=False,
        fp16=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        **({"max_tool_calling_iterations": spec["max_tool_calls"]} if spec["task"] == "tool" else {}),
    )
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    reward = task.trl_vowel_share if spec["task"] == "single" else task.trl_tool_reward
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Probe()],
        **({"tools": [task.lookup]} if spec["task"] == "tool" else {}),
    )
    trainer.train()
    out.close()


if __name__ == "__main__":
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    main(sys.argv[1])
