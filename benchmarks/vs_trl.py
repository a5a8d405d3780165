"""This project against TRL 1.16's ``GRPOTrainer`` on the same task, model, reward, batch and
generation length: step time, CPU seconds per step, generated tokens per step, reward curve and
time to a reward target, streaming and sync, several seeds interleaved.

What both trainers get (``_vs_trl_task.py``; the settings checked equal are in the JSON's
``matched``, the ones that cannot be matched in ``unmatched``):

- the same tiny random Qwen3 (its tokenizer a byte-level BPE with Qwen's control tokens and TRL's
  own ``qwen3.jinja`` chat template), saved once and loaded by both from the same directory, fp32;
- 64 chat prompts; ``--groups`` x ``--group-size`` completions per step (8 x 8), at most
  ``--max-tokens`` (16) generated tokens each, temperature 1;
- the reward: the completion's vowel share, a user function by ``module:function`` in the
  project (as a user writes it: it runs in a worker process) and a plain function in TRL;
- AdamW, lr ``--lr`` constant, no weight decay, gradient clipping 1.0, TRL's default loss (the
  project's ``objective: {preset: trl, is_correction: none}``: TRL has no rollout importance
  correction without vLLM), one torch thread per process (``OMP_NUM_THREADS=1``).

Tasks: ``single`` (one turn) and ``tool`` (TRL's ``tools=`` loop against the project's
``DatasetTasks(tools=...)``: the start is taught to call ``lookup`` with the prompt's word half
the time before it answers; the reward is the final answer's vowel share).

Every configuration runs as a fresh process (TRL in its own virtual environment, ``--trl-python``;
the project through ``thundersync-lightning fit``); per seed, the configurations run one after the
other in an order rotated by the seed, so slow drift on a shared machine touches all alike. A step's
time is the wall clock between two consecutive step ends (everything in between counts: generation,
scoring, backward, rewards, the optimizer, the trainer's own book-keeping); its CPU seconds are
those of the whole process tree (generation process, reward and tool workers included) over the
same interval. The first ``--warmup`` steps are left out of the step figures. Ratios are per seed
(the same seed's runs, adjacent in time), then the median over seeds.

Usage::

    make bench-vs-trl                           # builds .venv-trl (TRL 1.16, torch 2.13 CPU), full run
    python benchmarks/vs_trl.py --trl-python .venv-trl/bin/python [--quick] [--out DIR]

``--quick`` writes to ``runs/bench-quick`` unless ``--out`` is given: a quick run never replaces
the committed ``benchmarks/results/vs_trl.json``. ``--from-runs FILE`` re-summarises the per-step
records an earlier run stored in its JSON (``runs``) with this script's current summary, running
nothing; the result names the run that measured them (``measured_by``, ``measured_at_utc``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _vs_trl_task as task  # noqa: E402
from _common import RESULTS_DIR, machine_info, write_result  # noqa: E402

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
CONFIGS = ("trl", "streaming", "sync")

MODEL = {
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}

UNMATCHED = {
    "generation": "TRL generates with transformers' generate() in the training process, left-padded batch of "
    "64; the project's embedded engine generates in its own process, its own batching (the "
    "same sampling distribution: temperature 1, no top-p/top-k)",
    "sampling_noise": (
        "the seeds draw different completions in the two trainers (different samplers), so "
        "curves match in distribution, not token for token"
    ),
    "reward_call": (
        "TRL calls the reward once per step on the whole batch in its own process; the project "
        "calls a module:function reward per completion in a worker process (user code is confined)"
    ),
    "eos_token_counting": (
        "generated tokens per step are each trainer's own count (TRL: "
        "completions/mean_length x batch; the project: scored tokens), equal budgets checked, counts reported"
    ),
    "tool_budget": (
        "tool task: TRL's max_completion_length bounds the whole multi-turn completion (tool "
        "results included); the project's max_action_tokens bounds each turn (max_turns turns)"
    ),
    "threads": "TRL runs generation and learning in one process on one thread; the project's learner and "
    "generation process have one thread each and overlap where the mode allows (streaming)",
}


# --- set-up: the shared start, data and template ------------------------------------------------------------


def qwen3_template(trl_python: str) -> str:
    """TRL's own copy of Qwen3's chat template (TRL recognises it and parses its tool calls)."""
    code = "import trl.chat_template_utils as c; import sys; sys.stdout.write(c.qwen3_chat_template)"
    return subprocess.run([trl_python, "-c", code], check=True, capture_output=True, text=True).stdout


def save_start(directory: Path, template: str, teach_calls: bool, seed: int = 0) -> dict[str, Any]:
    """The tokenizer and the random tiny Qwen3; with ``teach_calls`` a short supervised warm-up on
    renderings where the assistant calls ``lookup`` half the time (the format, not the task)."""
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    corpus = [p for t in ("single", "tool") for p in task.prompts(t)]
    corpus += [call_text(w) for w in task.TOPICS]
    corpus += [
        "system\n# Tools\n\nYou may call one or more functions to assist with the user query.",
        "assistant\n",
        "user\n",
        "<tool_response>\n",
        "aeiou the a e i o u and of to in",
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus * 8, trainer)
    tok.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t in (
                "<think>",
                "</think>",
                "<tool_call>",
                "</tool_call>",
                "<tool_response>",
                "</tool_response>",
            )
        ]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = template
    fast.save_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **MODEL,
    )
    model = Qwen3ForCausalLM(config)
    record: dict[str, Any] = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
    }
    if teach_calls:
        record["warmup_loss"] = teach_tool_calls(model, tokenizer, seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory)
    return record


def teach_tool_calls(model: Any, tokenizer: Any, seed: int, steps: int = 60) -> list[float]:
    """Next-token training on first assistant turns: a ``lookup`` call of the prompt's word half the
    time, a short answer otherwise (the tools in the system turn as both trainers render them)."""
    import random

    import torch

    rng = random.Random(seed)
    tools = [_lookup_schema()]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        rows = []
        for word in rng.sample(task.TOPICS, 16):
            messages = [{"role": "user", "content": f"Look up the word {word} and answer with it."}]
            prompt = tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False
            )
            target = (call_text(word) if rng.random() < 0.5 else f"The {word}.") + "<|im_end|>"
            p, t = (
                tokenizer(prompt, add_special_tokens=False)["input_ids"],
                tokenizer(target, add_special_tokens=False)["input_ids"],
            )
            rows.append((p + t, [-100] * len(p) + t))
        width = max(len(r) for r, _ in rows)
        pad = tokenizer.pad_token_id
        ids = torch.tensor([r + [pad] * (width - len(r)) for r, _ in rows])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
        mask = (torch.arange(width)[None, :] < torch.tensor([len(r) for r, _ in rows])[:, None]).long()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(float(loss.detach()), 4))
    return [losses[0], losses[-1]]


def call_text(word: str) -> str:
    """A ``lookup`` call as Qwen3's template writes one."""
    return "<tool_call>\n" + json.dumps({"name": "lookup", "arguments": {"word": word}}) + "\n</tool_call>"


def _lookup_schema() -> dict[str, Any]:
    from transformers.utils import get_json_schema

    return get_json_schema(task.lookup)


def write_data(path: Path, kind: str) -> None:
    rows = [{"prompt": [{"role": "user", "content": p}]} for p in task.prompts(kind)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# --- one run per configuration ------------------------------------------------------------------------------


def steps_of(args: argparse.Namespace, kind: str) -> int:
    return args.tool_steps if kind == "tool" else args.steps


def project_yaml(
    args: argparse.Namespace,
    kind: str,
    mode: str,
    seed: int,
    model: Path,
    data: Path,
    run_dir: Path,
    steps_path: Path,
) -> str:
    tool = kind == "tool"
    tasks = {
        "path": str(data),
        "reward": "_vs_trl_task:vowel_share",
        "tokenizer_path": str(model),
        "max_action_tokens": args.max_tokens,
        "val_fraction": 0.0,
        **({"tools": ["_vs_trl_task:lookup"], "max_turns": args.max_tool_calls + 1} if tool else {}),
    }
    engine = {
        "num_threads": 1,
        "temperature": 1.0,
        **({"env_workers": args.env_workers} if args.env_workers else {}),
    }
    config = {
        "seed_everything": seed,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": steps_of(args, kind),
            "log_every_n_steps": 1,
            "gradient_clip_val": 1.0,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "enable_checkpointing": False,
            "logger": False,
            "default_root_dir": str(run_dir),
            "strategy": {
                "class_path": "thundersync_lightning.strategy.ThunderSyncStrategy",
                "init_args": {"mode": mode},
            },
            "callbacks": [{"class_path": "_vs_trl_probe.StepProbe", "init_args": {"path": str(steps_path)}}],
        },
        "model": {
            "pretrained_path": str(model),
            "lr": args.lr,
            "objective": {"preset": "trl", "is_correction": "none"},
        },
        "data": {
            "tasks": {"class_path": "thundersync_lightning.envs.datasets.DatasetTasks", "init_args": tasks},
            "engine": {
                "class_path": "thundersync_lightning.rollout.EmbeddedEngineConfig",
                "init_args": engine,
            },
            "group_size": args.group_size,
            "groups_per_step": args.groups,
            "seed": seed,
        },
    }
    return json.dumps(config, indent=1)  # JSON is YAML


def run_one(args: argparse.Namespace, work: Path, kind: str, config: str, seed: int) -> dict[str, Any]:
    """One fresh process of ``config`` on ``kind``; its per-step probe lines and process figures."""
    run_dir = work / f"{kind}-{config}-{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    steps_path = run_dir / "steps.jsonl"
    model, data = work / f"start-{kind}", work / f"{kind}.jsonl"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join([str(BENCH), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    if config == "trl":
        spec = {
            "model": str(model),
            "data": str(data),
            "task": kind,
            "seed": seed,
            "steps": steps_of(args, kind),
            "lr": args.lr,
            "groups": args.groups,
            "group_size": args.group_size,
            "max_completion_tokens": args.max_tokens * (args.max_tool_calls + 1 if kind == "tool" else 1),
            "max_tool_calls": args.max_tool_calls,
            "threads": 1,
            "run_dir": str(run_dir),
            "steps_path": str(steps_path),
        }
        (run_dir / "spec.json").write_text(json.dumps(spec))
        cmd = [args.trl_python, str(BENCH / "_vs_trl_trl.py"), str(run_dir / "spec.json")]
    else:
        (run_dir / "config.yaml").write_text(
            project_yaml(args, kind, config, seed, model, data, run_dir, steps_path)
        )
        cmd = [
            sys.executable,
            "-c",
            "from thundersync_lightning.cli import main; main()",
            "fit",
            "--config",
            str(run_dir / "config.yaml"),
        ]
    start = time.monotonic()
    with open(run_dir / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(run_dir))
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    if status != 0:
        raise RuntimeError(
            f"{kind}/{config} seed {seed} exited {status}: see {run_dir / 'log.txt'}\n"
            + (run_dir / "log.txt").read_text()[-3000:]
        )
    lines = [json.loads(line) for line in steps_path.read_text().splitlines()]
    return {
        "task": kind,
        "config": config,
        "seed": seed,
        "process_wall_s": wall,
        "process_cpu_s": usage.ru_utime + usage.ru_stime,
        "steps": per_step(lines),
    }


def per_step(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Step ``k``: the probe's line ``k`` minus line ``k - 1`` (line 0: the fit's start)."""
    out = []
    for prev, cur in zip(lines, lines[1:], strict=False):
        cpu = {k: cur["cpu"][k] - prev["cpu"][k] for k in cur["cpu"]}
        out.append(
            {
                "step": cur["step"],
                "wall_s": cur["wall"] - prev["wall"],
                "cpu_s": cpu.pop("total"),
                "cpu_s_by_process": cpu,
                "tokens": cur["tokens"],
                "completions": cur["completions"],
                "reward": cur["reward"],
                "failures": cur["failures"],
                "tool_calls": cur["tool_calls"],
                **{
                    k: cur[k]
                    for k in (
                        "learner_s",
                        "learner_calls",
                        "learner_calls_by_path",
                        "backward_passes",
                        "max_batch_trajectories",
                        "hold_after_s",
                        "step_seconds_inside",
                    )
                    if k in cur
                },
            }
        )
    return out


# --- summaries ----------------------------------------------------------------------------------------------


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def time_to_target(steps: list[dict[str, Any]], target: float, window: int) -> dict[str, Any]:
    """The first step whose mean reward over the last ``window`` steps is >= ``target``, and the
    seconds from the first step's start to that step's end (None, None: not reached)."""
    elapsed = 0.0
    for i, s in enumerate(steps):
        elapsed += s["wall_s"]
        recent = steps[max(0, i + 1 - window) : i + 1]
        if len(recent) == window and sum(r["reward"] for r in recent) / window >= target:
            return {"steps": s["step"], "seconds": elapsed}
    return {"steps": None, "seconds": None}


def summarise(args: argparse.Namespace, runs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    mine = [r for r in runs if r["task"] == kind]
    per_config: dict[str, Any] = {}
    for config in CONFIGS:
        rs = [r for r in mine if r["config"] == config]
        if not rs:
            continue
        timed = [s for r in rs for s in r["steps"][args.warmup :]]
        step = median([s["wall_s"] for s in timed])
        cpu = median([s["cpu_s"] for s in timed])
        ttt = [time_to_target(r["steps"], args.target, args.window) for r in rs]
        reached = [t for t in ttt if t["seconds"] is not None]
        per_config[config] = {
            "step_s_median": step,
            "cpu_s_per_step_median": cpu,
            "cpu_per_wall": (sum(s["cpu_s"] for s in timed) / sum(s["wall_s"] for s in timed))
            if timed
            else None,
            "tokens_per_step_median": median([s["tokens"] for s in timed]),
            # where the time goes: CPU seconds per step by process, and the project's learner by kind
            "cpu_s_per_step_by_process": {
                k: statistics.mean(s["cpu_s_by_process"][k] for s in timed)
                for k in timed[0]["cpu_s_by_process"]
            },
            "learner_s_per_step": (
                {k: statistics.mean(s["learner_s"][k] for s in timed) for k in timed[0]["learner_s"]}
                if "learner_s" in timed[0]
                else None
            ),
            "learner_calls_per_step": median([s["learner_calls"] for s in timed])
            if "learner_calls" in timed[0]
            else None,
            "learner_calls_per_step_by_path": (
                {
                    k: statistics.mean(s["learner_calls_by_path"][k] for s in timed)
                    for k in ("direct", "bucket", "held")
                }
                if "learner_calls_by_path" in timed[0]
                else None
            ),
            "completions_per_step": median([s["completions"] for s in timed]),
            "tool_calls_per_step_median": median([s["tool_calls"] for s in timed]),
            "failures_total": sum(s["failures"] for r in rs for s in r["steps"]),
            "reward_first": median([r["steps"][0]["reward"] for r in rs]),
            "reward_last10": median([statistics.mean(s["reward"] for s in r["steps"][-10:]) for r in rs]),
            "target_reached": f"{len(reached)}/{len(rs)}",
            # a run that did not reach the target counts as +inf: the median is None when it falls on one
            "steps_to_target_median": _median_inf([t["steps"] for t in ttt]),
            "seconds_to_target_median": _median_inf([t["seconds"] for t in ttt]),
            "step_s_by_seed": {
                r["seed"]: median([s["wall_s"] for s in r["steps"][args.warmup :]]) for r in rs
            },
            "cpu_s_by_seed": {r["seed"]: median([s["cpu_s"] for s in r["steps"][args.warmup :]]) for r in rs},
            "reward_by_step": [
                median([r["steps"][i]["reward"] for r in rs if i < len(r["steps"])])
                for i in range(max(len(r["steps"]) for r in rs))
            ],
        }
    ratios: dict[str, Any] = {}
    for a, b in (("streaming", "trl"), ("sync", "trl"), ("streaming", "sync")):
        if a in per_config and b in per_config:
            seeds = sorted(set(per_config[a]["step_s_by_seed"]) & set(per_config[b]["step_s_by_seed"]))
            ratios[f"{a}_over_{b}"] = {
                "step_paired_median": median(
                    [per_config[a]["step_s_by_seed"][s] / per_config[b]["step_s_by_seed"][s] for s in seeds]
                ),
                "step_of_medians": per_config[a]["step_s_median"] / per_config[b]["step_s_median"],
                "cpu_paired_median": median(
                    [per_config[a]["cpu_s_by_seed"][s] / per_config[b]["cpu_s_by_seed"][s] for s in seeds]
                ),
            }
    return {
        "configs": per_config,
        "ratios": ratios,
        "targets": targets(per_config, ratios, kind),
        "where_the_time_goes": where_the_time_goes(per_config),
    }


def where_the_time_goes(per: dict[str, Any]) -> dict[str, str]:
    """Each configuration's CPU seconds per step by process and the project's learner busy seconds
    by kind, in words: what a missed target is made of."""
    out = {}
    for config, c in per.items():
        cpu = ", ".join(f"{k} {v:.3f}" for k, v in c["cpu_s_per_step_by_process"].items())
        text = f"CPU s/step by process: {cpu}"
        if c.get("learner_s_per_step"):
            busy = ", ".join(f"{k} {v:.3f}" for k, v in c["learner_s_per_step"].items())
            text += f"; learner busy s/step: {busy}; learner calls/step {c['learner_calls_per_step']}"
        out[config] = text + f"; CPU per wall {c['cpu_per_wall']:.2f}"
    return out


def _median_inf(values: list[float | None]) -> float | None:
    if not values:
        return None
    m = statistics.median([float("inf") if v is None else v for v in values])
    return None if m == float("inf") else m


def targets(per: dict[str, Any], ratios: dict[str, Any], kind: str) -> dict[str, Any]:
    """The issue's targets, each with the measured value it was judged on (None: not measured)."""
    out: dict[str, Any] = {}

    def check(name: str, value: float | None, limit: float) -> None:
        out[name] = {"value": value, "limit": limit, "met": None if value is None else value <= limit}

    if kind == "single":
        check("streaming_step_over_trl", ratios.get("streaming_over_trl", {}).get("step_paired_median"), 1.0)
        check("streaming_cpu_over_trl", ratios.get("streaming_over_trl", {}).get("cpu_paired_median"), 1.2)
        check(
            "streaming_step_over_sync", ratios.get("streaming_over_sync", {}).get("step_paired_median"), 1.05
        )
    trl_s = per.get("trl", {}).get("seconds_to_target_median")
    for mode in ("streaming", "sync"):
        mine = per.get(mode, {}).get("seconds_to_target_median")
        ahead = (
            None
            if mine is None and trl_s is None
            else (mine is not None and (trl_s is None or mine <= trl_s))
        )
        out[f"{mode}_time_to_target_ahead_of_trl"] = {"value": mine, "trl": trl_s, "met": ahead}
    return out


def plot(path: Path, tasks: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(tasks), figsize=(5.5 * len(tasks), 7), dpi=100, squeeze=False)
    for col, (kind, summary) in enumerate(tasks.items()):
        per = summary["configs"]
        ax = axes[0][col]
        names = list(per)
        ax.bar(
            [i - 0.2 for i in range(len(names))],
            [per[n]["step_s_median"] for n in names],
            0.4,
            label="step s",
        )
        ax.bar(
            [i + 0.2 for i in range(len(names))],
            [per[n]["cpu_s_per_step_median"] for n in names],
            0.4,
            label="CPU s / step",
        )
        ax.set_xticks(range(len(names)), names)
        ax.set_title(f"{kind}: median step (wall) and CPU seconds per step", fontsize=9)
        ax.legend(fontsize=7)
        ax = axes[1][col]
        for n in names:
            curve = per[n]["reward_by_step"]
            ax.plot(range(1, len(curve) + 1), curve, label=n)
        ax.set_xlabel("step")
        ax.set_ylabel("mean reward (median over seeds)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every run: the starts' records and each run's per-step records."""
    template = qwen3_template(args.trl_python)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        work = Path(tmp)
        starts = {
            kind: save_start(work / f"start-{kind}", template, teach_calls=kind == "tool")
            for kind in args.tasks
        }
        for kind in args.tasks:
            write_data(work / f"{kind}.jsonl", kind)
        for seed in args.seeds:
            for kind in args.tasks:
                order = args.configs[seed % len(args.configs) :] + args.configs[: seed % len(args.configs)]
                for config in order:
                    run = run_one(args, work, kind, config, seed)
                    runs.append(run)
                    steps = run["steps"][args.warmup :]
                    print(
                        f"{kind:6s} {config:9s} seed {seed}: step {median([s['wall_s'] for s in steps]):.3f} "
                        f"s, CPU {median([s['cpu_s'] for s in steps]):.3f} s, last reward "
                        f"{run['steps'][-1]['reward']:.3f}",
                        flush=True,
                    )
    return starts, runs


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--trl-python",
        default=str(ROOT / ".venv-trl" / "bin" / "python"),
        help="a Python with trl==1.16.0 (make bench-vs-trl builds .venv-trl)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where vs_trl.json/.png go (default benchmarks/results; --quick: runs/bench-quick)",
    )
    parser.add_argument("--quick", action="store_true", help="2 seeds x 6 steps of each task (a smoke run)")
    parser.add_argument("--tasks", nargs="+", default=["single", "tool"], choices=["single", "tool"])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60, help="steps of each single-turn run")
    parser.add_argument(
        "--tool-steps",
        type=int,
        default=20,
        help="steps of each tool-task run (its prompts carry the tool schema: ~5x a single-turn step)",
    )
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of the step figures")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument(
        "--max-tokens", type=int, default=16, help="generated tokens per completion (per turn)"
    )
    parser.add_argument("--max-tool-calls", type=int, default=1, help="tool task: calls before the answer")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--target", type=float, default=0.5, help="reward target (mean over --window steps)")
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument(
        "--env-workers",
        type=int,
        default=None,
        help="EmbeddedEngineConfig(env_workers=...) (default: the project's default)",
    )
    parser.add_argument("--note", default="", help="what the machine was doing (recorded)")
    parser.add_argument(
        "--from-runs",
        type=Path,
        default=None,
        help="re-summarise the per-step records (`runs`) of an earlier vs_trl.json; runs nothing",
    )
    args = parser.parse_args(argv)
    args.trl_python = os.path.abspath(args.trl_python)  # the runs start in their own directories
    if args.quick:
        args.seeds, args.steps, args.tool_steps, args.warmup, args.window = args.seeds[:2], 6, 6, 2, 2
    out = args.out or (ROOT / "runs" / "bench-quick" if args.quick else RESULTS_DIR)
    if args.from_runs is not None:
        earlier = json.loads(args.from_runs.read_text())
        for key, value in earlier["settings"].items():  # the settings the runs were measured with
            setattr(args, key, value)
        runs, starts = earlier["runs"], earlier["starts"]
        load_start, load_end = (
            earlier["loaded_machine"]["load_average_start"],
            earlier["loaded_machine"]["load_average_end"],
        )
        args.note = args.note or earlier["loaded_machine"]["note"]
        measured = {
            "measured_by": earlier["command"],
            "measured_at_utc": earlier["timestamp_utc"],
            "measured_git_commit": earlier["git_commit"],
            "measured_machine": earlier["machine"],
        }
    else:
        load_start = list(os.getloadavg())
        starts, runs = measure(args)
        load_end, measured = list(os.getloadavg()), {}
    tasks = {kind: summarise(args, runs, kind) for kind in args.tasks}
    for kind, summary in tasks.items():
        tokens = {c: v["tokens_per_step_median"] for c, v in summary["configs"].items()}
        completions = {c: v["completions_per_step"] for c, v in summary["configs"].items()}
        assert len(set(completions.values())) == 1, f"{kind}: completions per step differ: {completions}"
        summary["tokens_per_step_over_trl"] = {
            c: t / tokens["trl"] for c, t in tokens.items() if "trl" in tokens
        }
    payload = {
        "quick": args.quick,
        "loaded_machine": {"load_average_start": load_start, "load_average_end": load_end, "note": args.note},
        **measured,
        "load_average_start": load_start,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "note", "from_runs")},
        "starts": starts,
        "matched": {
            "model": "one directory, loaded by both (fp32)",
            "prompts": 64,
            "completions_per_step": args.groups * args.group_size,
            "group_size": args.group_size,
            "max_tokens_per_completion": args.max_tokens,
            "temperature": 1.0,
            "lr": args.lr,
            "optimizer": "AdamW(betas 0.9, 0.999; eps 1e-8; weight decay 0), constant lr",
            "gradient_clip": 1.0,
            "loss": "TRL 1.16 default (dapo token-mean, beta 0, eps 0.2)",
            "threads_per_process": 1,
        },
        "unmatched": UNMATCHED,
        "tasks": tasks,
        "runs": runs,
        "trl_version": subprocess.run(
            [args.trl_python, "-c", "import trl; print(trl.__version__)"], capture_output=True, text=True
        ).stdout.strip(),
        "machine_during": machine_info().get("load_average_1m_5m_15m"),
    }
    path = write_result(out, "vs_trl", payload)
    plot(out / "vs_trl.png", tasks)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
