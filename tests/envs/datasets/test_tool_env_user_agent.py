"""The user's own tool agent from YAML alone: a JSONL dataset (a conversational row with its system
prompt, a plain row, a row with a null field), Python tools by name (one that adds, one that hangs,
one that raises), two weighted rewards, a Qwen3-style template with ``<think>``, a small model,
fitted by ``thundersync-lightning fit``.

The fit completes; every fault is counted (``rollout/tool_error_fraction``,
``rollout/tool_timeout_fraction``, the null row's failed trajectories), warned, and in
``summary.json``. The starting model is first taught to write calls (each tool a third of the
time), as a pretrained model that knows the call format but not these tools would. The fitted
checkpoint is then exported (``thundersync-lightning export``) and the directory loads in
transformers with the fitted module's logits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..qwen_style import model_config, save_tokenizer
from ..user_tools import TOOLS

CONFIG = """
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_steps: 2
  log_every_n_steps: 1
  enable_progress_bar: false
  logger:
    class_path: lightning.pytorch.loggers.CSVLogger
    init_args: {{save_dir: {run}, name: csv}}
  strategy: thundersync
model:
  pretrained_path: {model}
  lr: 0.0001
  temperature: 0.3          # the taught answers' tokens, with the tool name still a three-way draw
data:
  tasks:
    class_path: thundersync_lightning.envs.datasets.DatasetTasks
    init_args:
      path: {data}
      fields: {{answer: answer}}
      tools: [agent_tools:add, agent_tools:wait, agent_tools:explode]
      tool_timeout_s: 1.0
      reward: [agent_tools:correct, {{name: regex_match, pattern: "</tool_call>"}}]
      reward_weights: [1.0, 0.5]
      tokenizer_path: {model}
      template_kwargs: {{enable_thinking: false}}   # Qwen3's template closes an empty <think> block
      max_turns: 2
      max_action_tokens: 40
      val_fraction: 0.0
  engine:
    class_path: thundersync_lightning.rollout.EmbeddedEngineConfig
    init_args: {{num_threads: 1, env_workers: 2, temperature: 0.3}}
  group_size: 4
  groups_per_step: 3
"""

ROWS = [
    {
        "prompt": [
            {"role": "system", "content": "Use the tools."},
            {"role": "user", "content": "What is 2 + 3?"},
        ],
        "answer": "5",
    },
    {"prompt": "What is 4 + 4?", "answer": "8"},
    {"prompt": "What is 1 + 1?", "answer": None},
]  # cannot be scored: its trajectories fail, the fit goes on

CALLS = [
    '{"name": "add", "arguments": {"a": 2, "b": 3}}',
    '{"name": "wait", "arguments": {"seconds": 9}}',
    '{"name": "explode", "arguments": {"reason": "x"}}',
]


def save_start(model: str) -> None:
    """The tokenizer and a small random Qwen3 (two layers: one layer cannot learn the call's order)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    save_tokenizer(model)
    config = {
        **model_config(len(AutoTokenizer.from_pretrained(model))),
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 2,
    }
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**config)).save_pretrained(model)


def teach_calls(model: str, steps: int = 150) -> None:
    """Next-token training, all examples in one batch, on one-call answers (each tool equally): the
    tool name is the token left to chance."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from thundersync_lightning.envs.datasets import DatasetTasks

    tok = AutoTokenizer.from_pretrained(model)
    tasks = DatasetTasks(
        ROWS[:2],
        fields={"answer": "answer"},
        reward="exact_match",
        tokenizer_path=model,
        tools=["agent_tools:add", "agent_tools:wait", "agent_tools:explode"],
        template_kwargs={"enable_thinking": False},
    )
    rows = []
    for task in tasks.rows:
        prompt = list(tasks.renderer.prompt_ids(tasks.messages_of(task), [t.schema() for t in tasks.tools]))
        for call in CALLS:
            answer = tok.encode(f"<tool_call>\n{call}\n</tool_call>", add_special_tokens=False)
            rows.append((prompt, [*answer, tok.eos_token_id]))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)  # (n, L), right-padded
    labels = torch.full((len(rows), width), -100)
    for i, (prompt, answer) in enumerate(rows):
        ids[i, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        labels[i, len(prompt) : len(prompt) + len(answer)] = torch.tensor(answer)
    lm = AutoModelForCausalLM.from_pretrained(model)
    opt = torch.optim.Adam(lm.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = lm(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    lm.save_pretrained(model)


@pytest.mark.slow  # teaches the model calls (150 batched steps) and fits two steps with 1-s tool deadlines
def test_a_user_tool_agent_from_yaml_fits_through_a_hanging_tool_a_raising_tool_and_a_null_row(tmp_path):
    (tmp_path / "agent_tools.py").write_text(TOOLS)
    tmp_path.chmod(0o755)  # the tools' confined workers run as a uid of their own
    sys.path.insert(0, str(tmp_path))
    try:
        save_start(str(tmp_path / "model"))
        teach_calls(str(tmp_path / "model"))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("agent_tools", None)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    run = tmp_path / "run"
    (tmp_path / "agent.yaml").write_text(
        CONFIG.format(run=run, model=tmp_path / "model", data=tmp_path / "rows.jsonl")
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    cli = Path(sys.executable).with_name("thundersync-lightning")
    proc = subprocess.run(
        [str(cli), "fit", "--config", "agent.yaml", f"--trainer.default_root_dir={run}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["trajectories"] == 2 * 3 * 4
    assert summary["tool_error_fraction"] > 0 and summary["tool_timeout_fraction"] > 0
    failures = ("explode raised RuntimeError: exploded: x", "wait did not return within 1 s and was stopped")
    assert summary["tool_error_first"] in failures
    warned = [line for line in proc.stderr.splitlines() if "of the tool calls" in line]  # once per kind
    assert [
        sum("tool calls raised" in w for w in warned),
        sum("tool calls timed out" in w for w in warned),
    ] == [1, 1]
    assert all("The first tool failure of" in w and any(f in w for f in failures) for w in warned)
    (metrics,) = run.glob("csv/version_*/metrics.csv")
    rows = [
        dict(zip(metrics.read_text().splitlines()[0].split(","), line.split(",")))
        for line in metrics.read_text().splitlines()[1:]
    ]
    steps = [r for r in rows if r.get("rollout/tool_error_fraction")]
    assert len(steps) == 2  # each step's own counts
    assert sum(float(r["rollout/tool_error_fraction"]) for r in steps) > 0
    assert sum(float(r["rollout/tool_timeout_fraction"]) for r in steps) > 0
    assert all(
        0.0 <= float(r[f"rollout/reward/{name}_mean"]) <= 1.0
        for r in steps
        for name in ("correct", "regex_match")
    )
    assert sum(float(r["rollout/failures_count"]) for r in rows if r.get("rollout/failures_count")) >= 2 * 4
    ckpt = max((run / "checkpoints").glob("*.ckpt"), key=lambda p: (p.name == "last.ckpt", p.stat().st_mtime))
    exported = tmp_path / "exported"
    proc = subprocess.run(
        [str(cli), "export", "--ckpt_path", str(ckpt), "--out", str(exported)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    check_export(ckpt, exported)


def check_export(ckpt: Path, exported: Path) -> None:
    """The exported directory loads in transformers, its tokenizer renders the chat with the tools'
    markup, and its logits on that chat equal the fitted module's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from thundersync_lightning.modules import GRPOPolicy

    trained = GRPOPolicy.load_from_checkpoint(ckpt, map_location="cpu", weights_only=False).model.eval()
    served = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(exported, local_files_only=True)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    assert "<think>" in text and ids.shape[1] > 5
    with torch.no_grad():
        assert torch.equal(served(input_ids=ids).logits, trained(input_ids=ids).logits)
